// G3 on filesystems that lack what the fast path uses: ramfs and old tmpfs refuse O_DIRECT,
// ext2 has no fallocate, and a small tmpfs runs out of space. Each test mounts the
// filesystem in a private mount namespace of a forked child, and skips (saying why) where
// the machine does not let it mount.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "test_g3_support.hpp"

using namespace kvt_test;

namespace {

constexpr char kSkip[] = "SKIP: ";

// Runs fn in a child with `fs` mounted at a fresh directory (mount(8) arguments, run by the
// child after it entered its own mount namespace). Returns what fn reported.
std::string with_mount(const std::string &mount_args,
                       const std::function<std::string(const std::string &)> &fn) {
  TempDir dir;
  return in_child([&]() -> std::string {
    if (unshare(CLONE_NEWNS) != 0)
      return std::string(kSkip) + "unshare(CLONE_NEWNS): " + std::strerror(errno);
    // Named source and type, ignored here, because valgrind refuses NULL ones.
    if (mount("none", "/", "none", MS_REC | MS_PRIVATE, nullptr) != 0)
      return std::string(kSkip) + "mount --make-rprivate /: " + std::strerror(errno);
    std::string cmd = "mount " + mount_args + " " + dir.path + " 2>&1";
    if (std::system(cmd.c_str()) != 0) return std::string(kSkip) + "cannot run: " + cmd;
    std::string r = fn(dir.path);
    auto left = TempDir::names_of(dir.path, "kvtier-g3");
    if (r.empty() && !left.empty()) r = "left behind in the mount: " + left[0];
    return r;
  });
}

#define EXPECT_CHILD_OK(result)                                                  \
  do {                                                                           \
    std::string r_ = (result);                                                   \
    if (r_.rfind(kSkip, 0) == 0) GTEST_SKIP() << "mounting is not permitted here: " << r_; \
    EXPECT_EQ(r_, "");                                                           \
  } while (0)

// Whether the process's descriptor for path was opened (or switched) to O_DIRECT.
int direct_flag(const std::string &dir) {
  for (auto &e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (ec || target.string().rfind(dir + "/kvtier-g3-", 0) != 0) continue;
    std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
    std::string key;
    unsigned flags = 0;
    while (info >> key)
      if (key == "flags:") {
        info >> std::oct >> flags;
        return (flags & O_DIRECT) ? 1 : 0;
      }
  }
  return -1;
}

std::string create_status(const kvt_manager_config &c, kvt_status want, const char *part) {
  kvt_manager *m = nullptr;
  kvt_status s = kvt_manager_create(&m, &c);
  kvt_manager_destroy(m);
  if (s != want) return status_text("create", s) + ", wanted " + kvt_status_str(want);
  if (std::string(kvt_last_error()).find(part) == std::string::npos)
    return std::string("message lacks \"") + part + "\": " + kvt_last_error();
  return "";
}

bool have_mkfs_ext2() { return std::system("command -v mkfs.ext2 > /dev/null 2>&1") == 0; }

}  // namespace

// ramfs takes neither O_DIRECT nor fallocate: G3 goes through the page cache, says so once,
// and still moves the bytes intact.
TEST(G3Fs, RamfsWithoutODirectOrFallocate) {
  EXPECT_CHILD_OK(with_mount("-t ramfs none", [](const std::string &dir) -> std::string {
    LogCapture log;
    kvt_manager_config c = g3_config(dir.c_str(), 64);
    kvt_manager *m = nullptr;
    if (kvt_status s = kvt_manager_create(&m, &c); s != KVT_OK) return status_text("create", s);
    std::string r = g3_roundtrip(m, 1, 8, 5);
    if (r.empty() && direct_flag(dir) != 0) r = "O_DIRECT on ramfs?";
    kvt_manager_destroy(m);
    if (r.empty() && log.find(KVT_LOG_WARN, "O_DIRECT").size() != 1)
      r = "wanted one WARN about O_DIRECT, got " +
          std::to_string(log.find(KVT_LOG_WARN, "O_DIRECT").size());
    return r;
  }));
}

// A tmpfs too small for the file: KVT_ERR_NO_SPACE, and no file left; one that fits works.
TEST(G3Fs, FullTmpfsIsNoSpace) {
  EXPECT_CHILD_OK(with_mount("-t tmpfs -o size=1m none", [](const std::string &dir) -> std::string {
    if (auto r = create_status(g3_config(dir.c_str(), 1024), KVT_ERR_NO_SPACE, dir.c_str());
        !r.empty())
      return "8 MiB on a 1 MiB tmpfs: " + r;
    if (!TempDir::names_of(dir).empty()) return "a failed create left a file";
    kvt_manager_config c = g3_config(dir.c_str(), 64);  // 512 KiB
    kvt_manager *m = nullptr;
    if (kvt_status s = kvt_manager_create(&m, &c); s != KVT_OK) return status_text("create", s);
    std::string r = g3_roundtrip(m, 1, 8, 6);
    kvt_manager_destroy(m);
    return r;
  }));
}

// ext2 has no fallocate: G3 fills its file with zeros through O_DIRECT, and a file larger
// than the filesystem is KVT_ERR_NO_SPACE, not "Invalid argument".
TEST(G3Fs, Ext2WithoutFallocate) {
  if (!have_mkfs_ext2()) GTEST_SKIP() << "mkfs.ext2 is not installed (e2fsprogs)";
  TempDir img_dir;
  std::string img = img_dir.path + "/ext2.img";
  std::string mk = "truncate -s 16M " + img + " && mkfs.ext2 -q -F " + img + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(mk.c_str()), 0) << mk;
  EXPECT_CHILD_OK(with_mount("-o loop " + img, [](const std::string &dir) -> std::string {
    LogCapture log;
    if (auto r = create_status(g3_config(dir.c_str(), 4096), KVT_ERR_NO_SPACE, "no room");
        !r.empty())
      return "32 MiB on a 16 MiB ext2: " + r;
    if (!TempDir::names_of(dir, "kvtier-g3-").empty()) return "a failed create left a file";
    kvt_manager_config c = g3_config(dir.c_str(), 1024);  // 8 MiB: fits
    kvt_manager *m = nullptr;
    if (kvt_status s = kvt_manager_create(&m, &c); s != KVT_OK) return status_text("create", s);
    std::string r = g3_roundtrip(m, 1, 8, 7);
    if (r.empty() && direct_flag(dir) != 1) r = "ext2 takes O_DIRECT, but G3 does not use it";
    kvt_manager_destroy(m);
    if (r.empty() && !log.find(KVT_LOG_WARN, "").empty())
      r = "unexpected WARN: " + log.find(KVT_LOG_WARN, "")[0];
    if (r.empty() && !TempDir::names_of(dir, "kvtier-g3-").empty()) r = "destroy left the file";
    return r;
  }));
}
