"""Network namespaces for partition tests: one namespace per cluster process, each joined by a
veth pair to a bridge that lives in a namespace of its own (where the test's clients run), on
addresses of the test's own (10.213.0.0/24). Nothing on the host changes: no host interface,
route or loopback is touched; every link, address and route is made inside the namespaces.

Partitions between two nodes are blackhole routes inside the two namespaces (this machine's
kernel has no tc actions and no nftables/iptables, and a link down would cut a node off from
everyone): a cut node's packets to the other are dropped, so its connections time out or fail
to connect, while its links to every other node keep working.

Every namespace is named `nrd-part-<pid>-<role>`; `remove_leftovers()` deletes those of test
runs whose process is gone, and `Network.close()` deletes this run's, killing what still runs
in them (only processes this test started live there)."""

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading

PREFIX = "nrd-part-"
SUBNET = "10.213.0"
BRIDGE_ADDR = f"{SUBNET}.1"
CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


def _ip(*args, check=True):
    """Runs `ip ARGS`; raises with ip's own message when it fails and `check` is set."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def unavailable_reason():
    """None when this process may make network namespaces, otherwise why not (a skip reason)."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (run the partition tests as root)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        added = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns add` could not run: {e}"
    if added.returncode != 0:
        return f"`ip netns add` is not permitted here: {added.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _namespaces():
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _kill_inside(ns):
    """SIGKILLs the processes still running in `ns` (started by a partition test)."""
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _delete(ns):
    _kill_inside(ns)
    _ip("netns", "del", ns, check=False)


def remove_leftovers():
    """Deletes the namespaces of earlier partition test runs whose process no longer exists
    (a run killed before its finalizers ran)."""
    for ns in _namespaces():
        m = re.fullmatch(rf"{re.escape(PREFIX)}(\d+)-.+", ns)
        if m and int(m.group(1)) != os.getpid() and not os.path.exists(f"/proc/{m.group(1)}"):
            _delete(ns)


def _setns(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        if _LIBC.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class Network:
    """A bridge namespace and one namespace per node (`add_node`), with per-peer cuts."""

    def __init__(self):
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge_ns = f"{self.tag}-br"
        self.nodes = {}  # name -> address
        self.cuts = set()  # frozenset({a, b})
        self._made = []
        self._home = None
        self._lock = threading.Lock()
        _ip("netns", "add", self.bridge_ns)
        self._made.append(self.bridge_ns)
        self._in(self.bridge_ns, "link", "add", "br0", "type", "bridge")
        self._in(self.bridge_ns, "link", "set", "br0", "up")
        self._in(self.bridge_ns, "link", "set", "lo", "up")
        self._in(self.bridge_ns, "addr", "add", f"{BRIDGE_ADDR}/24", "dev", "br0")

    def _in(self, ns, *args):
        return _ip("-n", ns, *args)

    def ns(self, name):
        return f"{self.tag}-{name}"

    def add_node(self, name, host):
        """A namespace for node `name` with address 10.213.0.<host> on its `eth0`."""
        ns, addr = self.ns(name), f"{SUBNET}.{host}"
        _ip("netns", "add", ns)
        self._made.append(ns)
        port = f"v{os.getpid() % 100000}{name}"[:15]
        self._in(self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                 "netns", ns)
        self._in(self.bridge_ns, "link", "set", port, "master", "br0", "up")
        self._in(ns, "link", "set", "lo", "up")
        self._in(ns, "link", "set", "eth0", "up")
        self._in(ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        self.nodes[name] = addr
        return addr

    def exec_prefix(self, name):
        """The command prefix that runs a program in node `name`'s namespace."""
        return ["ip", "netns", "exec", self.ns(name)]

    def cut(self, a, b):
        """Drops every packet between nodes `a` and `b` (both directions); others unaffected."""
        with self._lock:
            self._in(self.ns(a), "route", "add", "blackhole", f"{self.nodes[b]}/32")
            self._in(self.ns(b), "route", "add", "blackhole", f"{self.nodes[a]}/32")
            self.cuts.add(frozenset((a, b)))

    def heal(self, a, b):
        with self._lock:
            self._in(self.ns(a), "route", "del", "blackhole", f"{self.nodes[b]}/32")
            self._in(self.ns(b), "route", "del", "blackhole", f"{self.nodes[a]}/32")
            self.cuts.discard(frozenset((a, b)))

    def heal_all(self):
        for pair in list(self.cuts):
            self.heal(*sorted(pair))

    def enter(self):
        """Moves the calling thread (only it) into the bridge namespace, where every node is
        reachable; sockets it opens afterwards live there. `leave()` moves it back."""
        self._home = os.open(f"/proc/thread-self/ns/net", os.O_RDONLY)
        _setns(f"/run/netns/{self.bridge_ns}")

    def leave(self):
        if self._home is not None:
            try:
                if _LIBC.setns(self._home, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the test's namespace")
            finally:
                os.close(self._home)
                self._home = None

    def enter_thread(self):
        """For a worker thread of the test: moves it into the bridge namespace for good."""
        _setns(f"/run/netns/{self.bridge_ns}")

    def close(self):
        """Deletes every namespace this network made (killing what still runs in them)."""
        self.leave()
        for ns in reversed(self._made):
            _delete(ns)
        self._made.clear()
