"""The live monitor while it is torn down: what still arrives once its widgets are gone is dropped, never raised.

A poll can finish, the last redraw's row highlight can bubble up, the clock can tick and a dump's
worker can report back while Textual is removing the screen. Once in CI that raised
``NoMatches: No nodes match 'RanksTable'`` at teardown.
"""

from __future__ import annotations

import pytest
from textual import events
from textual.message import Message
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

from trainwatch.tui.app import PollFailed, SnapshotReady
from trainwatch.tui.widgets.groups import GroupsPane
from trainwatch.tui.widgets.ranks import RanksTable

from test_tui_app import make_app, until
from tui_samples import healthy, straggler


LATE_MESSAGES = {  # what reaches the app after its widgets are gone, by what sends it
    "poll finished": lambda table: SnapshotReady(healthy()),  # a poll that finished as the app quit
    "poll failed": lambda table: PollFailed("process 4242 is gone"),
    "row highlighted": lambda table: DataTable.RowHighlighted(table, 0, RowKey("node1:0")),  # the last redraw's
    "group picked": lambda table: GroupsPane.Picked(straggler().groups[0]),
}


@pytest.mark.parametrize("sender", LATE_MESSAGES)
async def test_a_message_arriving_while_the_screen_is_removed_raises_nothing(sender):
    app, _ = make_app(straggler(), healthy())
    posted: list[Message] = []

    def while_removing(message) -> None:
        """As the first widget is unmounted at teardown, queue on the app what a real race delivers then."""
        if armed and not posted and isinstance(message, events.Unmount):
            posted.append(LATE_MESSAGES[sender](table))
            app.post_message(posted[0])

    armed, table = False, None
    async with app.run_test(size=(120, 40), message_hook=while_removing) as pilot:
        await until(pilot, lambda: app.polls == 1)
        table = app.query_one(RanksTable)
        armed = True
    # run_test re-raises what the handler raised after the widgets were removed
    assert len(posted) == 1
    assert app.polls == 1  # a late snapshot or failure is dropped, not counted


async def test_handlers_timers_and_worker_callbacks_after_teardown_do_nothing(tmp_path):
    """The clock's timer and a dump worker's ``call_from_thread`` callbacks bypass the message queue."""
    app, _ = make_app(straggler())
    bundle = tmp_path / "trainwatch-node1-4242-bundle"
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        table = app.query_one(RanksTable)
    app.on_snapshot_ready(SnapshotReady(healthy()))
    app.on_poll_failed(PollFailed("process 4242 is gone"))
    app.on_data_table_row_highlighted(DataTable.RowHighlighted(table, 0, RowKey("node1:0")))
    app.on_groups_pane_picked(GroupsPane.Picked(straggler().groups[0]))
    app._tick()
    app._begin_poll()
    app._dump_failed("No space left on device")
    app._dumped(bundle)
    assert app.polls == 1 and app._polling_since is None  # nothing counted, no poll started
    assert app.dumps == [bundle]  # a bundle written as the app quit is still reported when it ends
