"""What the serving benchmarks share (bench/serve_sweep.py, bench/serve_soak.py): the CPU they ran
on, and one `cachetune serve` process on a free loopback port, started, awaited and stopped."""
import http.client
import json
import platform
import signal
import socket
import subprocess
import sys
import time


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def post_json(port, path, body, timeout=600):
    """POST a JSON body to the server on this port; its JSON answer, or RuntimeError."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class ServeProcess:
    """`binary serve --port P <flags>`, its output in log_path; returns once /health answers."""

    def __init__(self, binary, flags, log_path, who, startup_s=300):
        self.port = free_port()
        self.cmd = [binary, "serve", "--port", str(self.port)] + list(flags)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + startup_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{who}: server exited ({self.proc.returncode}); see {log_path}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        sys.exit(f"{who}: server did not come up; see {log_path}")

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
