"""The package without a C compiler, and the library's diagnostics through Python."""
import logging
import os
import subprocess
import sys

from test_kvtier import manager  # also puts the package on sys.path
import kvtier  # noqa: E402

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_import_needs_no_c_compiler():
    env = {"PATH": "", "PYTHONPATH": PACKAGE_DIR}  # no cc, gcc or clang to be found
    if "KVTIER_LIB_DIR" in os.environ:
        env["KVTIER_LIB_DIR"] = os.environ["KVTIER_LIB_DIR"]
    code = ("import shutil, kvtier; assert shutil.which('cc') is None; "
            "m = kvtier.Manager(g1_blocks=4); print(kvtier.version(), len(m.alloc(2)))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [kvtier.version(), "2"]


def stale_g3_file(directory):
    """A G3 file as a process that died with its manager would leave it."""
    path = os.path.join(str(directory), "kvtier-g3-999999-00000000deadbeef.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    return path


def test_log_handler_gets_the_librarys_messages(tmp_path):
    got = []
    kvtier.set_log_handler(lambda level, message: got.append((level, message)),
                           kvtier.LOG_INFO)
    try:
        path = stale_g3_file(tmp_path)
        with manager(g3_path=str(tmp_path), g3_blocks=4):
            pass
        assert not os.path.exists(path)
        assert any(level == kvtier.LOG_INFO and os.path.basename(path) in message
                   for level, message in got), got
        got.clear()
        kvtier.set_log_handler(lambda level, message: got.append(message), kvtier.LOG_WARN)
        stale_g3_file(tmp_path)
        with manager(g3_path=str(tmp_path), g3_blocks=4):
            pass
        assert got == []  # INFO is above WARN: not sent
    finally:
        kvtier.set_log_handler(None)


def test_log_handler_can_be_a_logger(tmp_path):
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("kvtier-test")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Collect())
    kvtier.set_log_handler(logger, kvtier.LOG_DEBUG)
    try:
        path = stale_g3_file(tmp_path)
        with manager(g3_path=str(tmp_path), g3_blocks=4):
            pass
    finally:
        kvtier.set_log_handler(None)
    assert [r.levelno for r in records if os.path.basename(path) in r.getMessage()] == [
        logging.INFO]
    n = len(records)
    stale_g3_file(tmp_path)
    with manager(g3_path=str(tmp_path), g3_blocks=4):
        pass
    assert len(records) == n  # off again
