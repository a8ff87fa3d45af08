"""G4 from Python against a real redis-server on a Unix socket: offload, match and onboard
between two managers, the keys Redis holds, the password and the MAC key."""
import shutil
import socket
import subprocess
import threading

import pytest

from test_kvtier import manager, stored  # also puts the package on sys.path
import kvtier  # noqa: E402

REDIS = shutil.which("redis-server")


class Redis:
    """A redis-server of its own in directory d, on d/r.sock; killed by stop()."""

    def __init__(self, d, *args):
        self.path = str(d / "r.sock")
        self.url = "unix://" + self.path
        self.proc = subprocess.Popen(
            [REDIS, "--port", "0", "--unixsocket", self.path, "--save", "", "--appendonly", "no",
             "--dir", str(d), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.proc.stdout:  # its log says when it listens
            if "ready to accept connections" in line:
                break
        else:
            raise RuntimeError("redis-server exited: %s" % self.proc.wait())
        # Its later log lines must not fill the pipe and stall it.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        assert self.command("PING").startswith((b"+PONG", b"-NOAUTH"))

    def command(self, *words):
        """One inline command's raw reply."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.path)
            s.sendall(" ".join(words).encode() + b"\r\n")
            return s.recv(65536)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def redis(tmp_path):
    if REDIS is None:
        pytest.skip("redis-server is not installed: G4 is not tested")
    servers = []

    def start(*args):
        d = tmp_path / ("redis%d" % len(servers))
        d.mkdir()
        servers.append(Redis(d, *args))
        return servers[-1]

    yield start
    for r in servers:
        r.stop()


def g4(url, **kw):
    return manager(**dict(dict(g4_url=url, g4_key_prefix="kvt-test", g4_namespace=0xA1,
                                g4_timeout_us=5_000_000, min_batch_size=1), **kw))


def test_g4_offload_match_and_onboard_between_managers(redis):
    r = redis()
    hashes = [11, 12, 13]
    with g4(r.url) as a:
        blocks = stored(a, hashes)  # block i filled with byte i
        want = [bytes(a.block_data(b)) for b in blocks]
        with a.offload(blocks, kvtier.G4) as x:
            assert x.wait(10) == 3
        a.release(blocks)
        assert a.transfer_stats(kvtier.G1, kvtier.G4).blocks == 3
        keys = r.command("KEYS", "kvt-test:*").split(b"\r\n")
        assert len([k for k in keys if k.startswith(b"kvt-test:00000000000000a1:")]) == 3
        assert a.g4_stats().stored_blocks == 3

    with g4(r.url) as b:  # another manager: nothing local, everything from Redis
        assert b.g4_match(hashes + [14]) == 3
        assert b.g4_match([14] + hashes) == 0
        dst = b.alloc(2)
        with b.g4_onboard(hashes[1:], dst, parent=hashes[0]) as x:  # a chain from its middle
            assert x.wait(10) == 2
            got = x.blocks()
        assert [bytes(b.block_data(h)) for h in got] == want[1:]
        assert [b.block_info(h).seq_hash for h in got] == hashes[1:]
        assert b.match_prefix(hashes[1:]) == got  # registered in G1
        b.release(got + got)
        with b.g4_onboard([99], b.alloc(1)) as x, pytest.raises(kvtier.NotFoundError):
            x.wait(10)
        s = b.g4_stats()
        assert (s.shards, s.lookups, s.hits, s.loaded_blocks, s.missing_blocks) == (1, 8, 3, 2, 1)
        assert s.bytes_read == 2 * 128 and s.round_trips >= 3 and s.corrupt_blocks == 0

    with g4(r.url, g4_namespace=0xA2) as other:  # another namespace sees none of it
        assert other.g4_match(hashes) == 0
    with manager() as no_g4, pytest.raises(kvtier.UnsupportedError):
        no_g4.g4_stats()
    r.stop()
    with g4(r.url, g4_timeout_us=200_000) as gone, pytest.raises(kvtier.IoError):
        gone.g4_match(hashes)


def test_g4_password_env_and_key_env(redis, monkeypatch):
    r = redis("--requirepass", "s3cret")
    monkeypatch.setenv("KVT_TEST_REDIS_PW", "s3cret")
    monkeypatch.setenv("KVT_TEST_G4_KEY", "ab" * 32)
    monkeypatch.setenv("KVT_TEST_G4_OTHER_KEY", "cd" * 32)
    keyed = dict(g4_password_env="KVT_TEST_REDIS_PW", g4_key_env="KVT_TEST_G4_KEY")
    with g4(r.url, **keyed) as a:
        blocks = stored(a, [21, 22], fill=0x77)
        with a.offload(blocks, kvtier.G4) as x:
            assert x.wait(10) == 2
        a.release(blocks)
    with g4(r.url) as no_password, pytest.raises(kvtier.IoError):
        no_password.g4_match([21, 22])
    with g4(r.url, **keyed) as b:
        assert b.g4_match([21, 22]) == 2
        with b.g4_onboard([21, 22], b.alloc(2)) as x:
            assert x.wait(10) == 2
            got = x.blocks()
        assert all(bytes(b.block_data(h)) == b"\x77" * 128 for h in got)
        b.release(got)
    with g4(r.url, g4_password_env="KVT_TEST_REDIS_PW",
            g4_key_env="KVT_TEST_G4_OTHER_KEY") as forger:
        assert forger.g4_match([21, 22]) == 2  # the keys are there, but not its MAC
        dst = forger.alloc(2)
        with forger.g4_onboard([21, 22], dst) as x, pytest.raises(kvtier.CorruptError):
            x.wait(10)
        assert forger.g4_stats().corrupt_blocks >= 1
        assert forger.g4_match([21, 22]) == 0  # a value that fails its MAC is deleted
        assert forger.block_info(dst[0]).state == kvtier.BlockState.EMPTY  # never served
        forger.release(dst)
