"""A Kubernetes API server stand-in for the tests: just what the real ``kubectl`` of this machine
asks of it when trainwatch lists a job's pods and runs an agent in each.

No Kubernetes server can run here. This one answers the real client's requests as the API server
does: discovery (``/api``, ``/api/v1``, ``/apis``), ``GET`` of a pod and ``list`` of pods by label
selector (a PodList), ``pods/exec`` over WebSocket (the ``v5.channel.k8s.io`` subprotocol kubectl
1.30+ speaks first: channel 0 stdin, 1 stdout, 2 stderr, 3 the exit Status, 255 a half-close), and
``Status`` errors (403 Forbidden from a small RBAC keyed by bearer token, 404, 400 for a container
that does not run). A pod's command is run in the pod's namespaces with ``nsenter`` (the pods are
PID/mount/UTS namespaces made by tests/k8s_pods.py), with the pod's environment, as a container
runtime's exec does; a command the pod's PATH lacks fails as runc's does.

The state (pods, users) is a JSON file the tests rewrite; it is read again when it changes. Run as
``python k8s_api.py --state FILE --listen ADDR:PORT [--listen ...]``; it serves until killed.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455
V5 = "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


class State:
    """The cluster as the tests describe it: ``{"pods": [pod, ...], "users": {token: {"name": …,
    "allow": [["list", "pods"], ...]}}}``; a pod is a Pod object plus ``"_init"`` (the PID its
    namespaces are entered through) and ``"_path"`` (its containers' PATH)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime = 0.0
        self._data: dict = {}
        self._lock = threading.Lock()

    def data(self) -> dict:
        with self._lock:
            mtime = self.path.stat().st_mtime
            if mtime != self._mtime:
                self._data, self._mtime = json.loads(self.path.read_text()), mtime
            return self._data


def matches(labels: dict, selector: str) -> bool:
    """An equality-based label selector: ``a=b,c!=d,e`` (what the tests use)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.strip() not in labels:
            return False
    return True


def status(code: int, reason: str, message: str, kind: str | None = None, name: str | None = None) -> dict:
    details = {k: v for k, v in (("name", name), ("kind", kind)) if v}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, **({"details": details} if details else {}), "code": code}


API_RESOURCES = {
    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
    "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "shortNames": ["po"],
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "categories": ["all"]},
        {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions",
         "verbs": ["create", "get"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
         "shortNames": ["ns"], "verbs": ["get", "list"]},
    ],
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainwatch-test-apiserver/1"

    def log_message(self, fmt: str, *args) -> None:  # noqa: D401 - quiet unless asked
        if os.environ.get("K8S_API_LOG"):
            sys.stderr.write("api: " + fmt % args + "\n")

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _user(self) -> tuple[str, set[tuple[str, str]]] | None:
        users = self.server.state.data().get("users") or {}
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        user = users.get(token)
        if user is None:
            return None
        allowed = {tuple(rule) for rule in user.get("allow", [])}
        return user["name"], allowed

    def _allowed(self, verb: str, resource: str, namespace: str, name: str | None = None) -> bool:
        who = self._user()
        if who is None:
            self._send(401, status(401, "Unauthorized", "Unauthorized"))
            return False
        user, allowed = who
        if (verb, resource) in allowed or ("*", "*") in allowed:
            return True
        subject = f'pods "{name}"' if name else "pods"
        self._send(403, status(403, "Forbidden", f'{subject} is forbidden: User "{user}" cannot {verb} resource '
                                                 f'"{resource}" in API group "" in the namespace "{namespace}"',
                               kind="pods", name=name))
        return False

    def _pods(self, namespace: str) -> list[dict]:
        return [p for p in self.server.state.data().get("pods", [])
                if p["metadata"].get("namespace", "default") == namespace]

    @staticmethod
    def _public(pod: dict) -> dict:
        return {k: v for k, v in pod.items() if not k.startswith("_")}

    # -- requests ----------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        query = parse_qs(url.query)
        if url.path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.headers.get("Host", "")}]})
        if url.path == "/apis":
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        if url.path == "/api/v1":
            return self._send(200, API_RESOURCES)
        if url.path == "/version":
            return self._send(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-trainwatch-test"})
        if len(parts) >= 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            namespace = parts[3]
            if len(parts) == 5:
                if not self._allowed("list", "pods", namespace):
                    return None
                selector = (query.get("labelSelector") or [""])[0]
                items = [self._public(p) for p in self._pods(namespace) if matches(p["metadata"].get("labels", {}),
                                                                                   selector)]
                return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                        "items": items})
            name = parts[5]
            pod = next((p for p in self._pods(namespace) if p["metadata"]["name"] == name), None)
            if len(parts) == 6:
                if not self._allowed("get", "pods", namespace, name):
                    return None
                if pod is None:
                    return self._send(404, status(404, "NotFound", f'pods "{name}" not found', "pods", name))
                return self._send(200, self._public(pod))
            if len(parts) == 7 and parts[6] == "exec":
                return self._exec(namespace, name, pod, query)
        return self._send(404, status(404, "NotFound", "the server could not find the requested resource"))

    def do_POST(self) -> None:  # noqa: N802 - kubectl's fallback to SPDY after a WebSocket upgrade failed
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        if len(parts) == 7 and parts[4] == "pods" and parts[6] == "exec":
            if not self._allowed("create", "pods/exec", parts[3], parts[5]):
                return None
            return self._send(400, status(400, "BadRequest", "this test API server speaks exec over WebSocket only"))
        return self._send(405, status(405, "MethodNotAllowed", "the server does not allow this method"))

    # -- exec ------------------------------------------------------------------------------------
    def _exec(self, namespace: str, name: str, pod: dict | None, query: dict) -> None:
        if not self._allowed("create", "pods/exec", namespace, name):
            return None
        if pod is None:
            return self._send(404, status(404, "NotFound", f'pods "{name}" not found', "pods", name))
        if V5 not in [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]:
            return self._send(400, status(400, "BadRequest", "only the v5.channel.k8s.io WebSocket protocol"))
        container = (query.get("container") or [pod["spec"]["containers"][0]["name"]])[0]
        command = query.get("command") or []
        running = any(s.get("name") == container and "running" in (s.get("state") or {})
                      for s in pod.get("status", {}).get("containerStatuses", []))
        if not running or not pod.get("_init"):
            return self._send(400, status(400, "BadRequest", f'container {container} is not valid for pod {name}'))
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", V5)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        Session(self.connection, pod, container, command, stdin="true" in (query.get("stdin") or [])).run()


def _frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, final WebSocket frame (a server's)."""
    head = bytes([0x80 | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([size])
    elif size < 1 << 16:
        head += bytes([126]) + struct.pack(">H", size)
    else:
        head += bytes([127]) + struct.pack(">Q", size)
    return head + payload


class Session:
    """One exec: the command in the pod's namespaces, its pipes carried over the WebSocket."""

    def __init__(self, conn: socket.socket, pod: dict, container: str, command: list[str], stdin: bool) -> None:
        self.conn, self.pod, self.container, self.command, self.want_stdin = conn, pod, container, command, stdin
        self.send_lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.buffer = b""

    def send(self, channel: int, data: bytes) -> None:
        with self.send_lock:
            try:
                self.conn.sendall(_frame(0x2, bytes([channel]) + data))
            except OSError:
                pass  # the client went: the command is stopped when its stdin closes

    def run(self) -> None:
        declared = next((c for c in self.pod["spec"]["containers"] if c["name"] == self.container), {})
        env = {"PATH": self.pod.get("_path") or "/usr/local/bin:/usr/bin:/bin",
               "HOSTNAME": self.pod.get("_hostname") or self.pod["metadata"]["name"], "HOME": "/root"}
        env.update({e["name"]: str(e["value"]) for e in declared.get("env", []) if "value" in e})
        env.update(self.pod.get("_env") or {})
        program = self.command[0] if self.command else ""
        if not self.command or (not os.path.isabs(program) and shutil.which(program, path=env["PATH"]) is None):
            message = (f'Internal error occurred: error executing command in container: failed to exec in container: '
                       f'failed to start exec: OCI runtime exec failed: exec failed: unable to start container '
                       f'process: exec: "{program}": executable file not found in $PATH: unknown')
            self.send(ERROR, json.dumps(status(500, "InternalError", message)).encode())
            self._close()
            return
        flags = ["-m", "-u", "-p"] + (["-n"] if self.pod.get("_own_net") else [])
        argv = ["nsenter", "-t", str(self.pod["_init"]), *flags, f"--wd={self.pod.get('_workdir') or '/'}",
                "env", "-i", *(f"{k}={v}" for k, v in env.items()), *self.command]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        if not self.want_stdin:
            self.proc.stdin.close()
        readers = [threading.Thread(target=self._pump, args=(self.proc.stdout, STDOUT), daemon=True),
                   threading.Thread(target=self._pump, args=(self.proc.stderr, STDERR), daemon=True)]
        for reader in readers:
            reader.start()
        inbound = threading.Thread(target=self._inbound, daemon=True)
        inbound.start()
        code = self.proc.wait()
        for reader in readers:
            reader.join(5)
        if code == 0:
            result = {"metadata": {}, "status": "Success"}
        else:
            result = {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                      "message": f"command terminated with non-zero exit code: exit status {code}",
                      "details": {"causes": [{"reason": "ExitCode", "message": str(code if code > 0 else 128 - code)}]}}
        self.send(ERROR, json.dumps(result).encode())
        self._close()

    def _pump(self, pipe, channel: int) -> None:
        while chunk := os.read(pipe.fileno(), 65536):
            self.send(channel, chunk)

    def _inbound(self) -> None:
        """The client's frames: stdin data, its half-close, pings; EOF or a close ends stdin."""
        try:
            while True:
                frame = self._read_frame()
                if frame is None:
                    break
                opcode, payload = frame
                if opcode == 0x8:
                    break
                if opcode == 0x9:
                    with self.send_lock:
                        self.conn.sendall(_frame(0xA, payload))
                    continue
                if opcode in (0x1, 0x2) and payload:
                    channel, data = payload[0], payload[1:]
                    if channel == STDIN and self.proc is not None and self.proc.stdin and not self.proc.stdin.closed:
                        try:
                            self.proc.stdin.write(data)
                            self.proc.stdin.flush()
                        except OSError:
                            pass  # the command no longer reads
                    elif channel == CLOSE and data[:1] == bytes([STDIN]):
                        self._close_stdin()
        except OSError:
            pass  # the connection broke: as a closed stdin
        self._close_stdin()

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _recv(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            pending = getattr(self.conn, "pending", lambda: 0)()  # TLS: bytes already decrypted
            ready = pending or select.select([self.conn], [], [], 1.0)[0]
            if not ready:
                if self.proc is not None and self.proc.poll() is not None:
                    return None
                continue
            chunk = self.conn.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _read_frame(self) -> tuple[int, bytes] | None:
        head = self._recv(2)
        if head is None:
            return None
        opcode, masked, size = head[0] & 0x0F, head[1] & 0x80, head[1] & 0x7F
        if size == 126:
            more = self._recv(2)
            size = struct.unpack(">H", more)[0] if more else 0
        elif size == 127:
            more = self._recv(8)
            size = struct.unpack(">Q", more)[0] if more else 0
        mask = self._recv(4) if masked else b"\0\0\0\0"
        payload = self._recv(size) if size else b""
        if mask is None or payload is None:
            return None
        if masked:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return opcode, payload

    def _close(self) -> None:
        with self.send_lock:
            try:
                self.conn.sendall(_frame(0x8, struct.pack(">H", 1000)))
            except OSError:
                pass
        try:
            self.conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: State, tls: ssl.SSLContext) -> None:
        self.state = state
        self.tls = tls
        super().__init__(address, Handler)

    def get_request(self):
        conn, addr = self.socket.accept()
        return self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request, client_address) -> None:
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError):
            return  # a client that gave up: nothing to answer
        super().finish_request(request, client_address)


def make_certs(folder: Path, addresses: list[str]) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for ``addresses`` (kubectl sends a bearer token only over TLS):
    (ca.crt, server.crt, server.key), made with the openssl command."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt"))
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True, timeout=60)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=trainwatch-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=kubernetes")
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=" + ",".join(f"IP:{a}" for a in addresses) + ",DNS:kubernetes\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--listen", action="append", required=True, metavar="ADDR:PORT")
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    args = parser.parse_args()
    state = State(args.state)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(args.cert, args.key)
    servers = []
    for where in args.listen:
        host, _, port = where.rpartition(":")
        servers.append(Server((host, int(port)), state, tls))
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("serving", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
