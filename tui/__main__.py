import sys

from trainwatch.tui.cli import main

sys.exit(main())
