// G3's file across processes: a killed owner's file (and temporary directory) is removed by
// the next manager that starts there, a live owner's never is, a restart under the same PID
// starts, and g3_path "" is refused.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "test_g3_support.hpp"

using namespace kvt_test;

namespace {

bool is_g3_file(const std::string &n) { return n.rfind("kvtier-g3-", 0) == 0; }

std::vector<std::string> g3_files(const std::string &dir) {
  std::vector<std::string> v;
  for (auto &e : std::filesystem::directory_iterator(dir))
    if (is_g3_file(e.path().filename().string())) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> minus(std::vector<std::string> a, const std::vector<std::string> &b) {
  std::erase_if(a, [&](const std::string &x) {
    return std::find(b.begin(), b.end(), x) != b.end();
  });
  return a;
}

void touch(const std::string &path) { std::ofstream(path) << "left behind"; }

// Sets TMPDIR for the test's lifetime (the library's temporary directories go there).
struct ScopedTmpdir {
  std::string old;
  bool had;
  explicit ScopedTmpdir(const std::string &dir) {
    const char *o = std::getenv("TMPDIR");
    had = o != nullptr;
    if (had) old = o;
    setenv("TMPDIR", dir.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (had) setenv("TMPDIR", old.c_str(), 1);
    else unsetenv("TMPDIR");
  }
};

}  // namespace

TEST(G3Files, KilledOwnersFileGoesLiveOwnersFileStays) {
  TempDir dir;
  Owner live(dir.path.c_str());
  ASSERT_TRUE(live.ready());
  auto live_files = g3_files(dir.path);
  Owner dead(dir.path.c_str());
  ASSERT_TRUE(dead.ready());
  auto dead_files = minus(g3_files(dir.path), live_files);
  ASSERT_EQ(live_files.size(), 1u);
  ASSERT_EQ(dead_files.size(), 1u);
  dead.kill9();
  ASSERT_EQ(g3_files(dir.path).size(), 2u) << "kill -9 leaves the file until someone cleans up";

  LogCapture log;
  kvt_manager_config c = g3_config(dir.path.c_str());
  auto m = make(c);
  ASSERT_TRUE(m);
  auto now = g3_files(dir.path);
  EXPECT_EQ(std::count(now.begin(), now.end(), dead_files[0]), 0) << "the dead owner's file stays";
  EXPECT_EQ(std::count(now.begin(), now.end(), live_files[0]), 1) << "a live owner's file went";
  EXPECT_EQ(now.size(), 2u);
  EXPECT_EQ(log.find(KVT_LOG_INFO, dead_files[0]).size(), 1u) << "no INFO line for the cleanup";
  auto mine = minus(now, live_files);

  // The other process dies too; a second manager in this process removes its file, and
  // leaves the first manager's alone, although both are this process's.
  live.kill9();
  auto m2 = make(c);
  ASSERT_TRUE(m2);
  now = g3_files(dir.path);
  EXPECT_EQ(std::count(now.begin(), now.end(), live_files[0]), 0);
  EXPECT_EQ(std::count(now.begin(), now.end(), mine[0]), 1) << "a live manager's file went";
  EXPECT_EQ(now.size(), 2u);
  EXPECT_EQ(g3_roundtrip(m.get(), 100, 4, 1), "");
  EXPECT_EQ(g3_roundtrip(m2.get(), 200, 4, 2), "");
  m.reset();
  m2.reset();
  EXPECT_TRUE(g3_files(dir.path).empty()) << "destroy removes the file";
}

TEST(G3Files, FileIsLockedWhileItsManagerLives) {
  TempDir dir;
  auto m = make(g3_config(dir.path.c_str()));
  ASSERT_TRUE(m);
  auto files = g3_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  std::string path = dir.path + "/" + files[0];
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), -1) << "nothing tells a live owner from a dead one";
  EXPECT_EQ(errno, EWOULDBLOCK);
  close(fd);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(uint64_t(st.st_size), 16u * 8192) << "16 slots of 4 KiB data + 4 KiB header";
}

// A restarted container usually gets the same PID as the process that died. Files named
// the way a dead process with this PID would have named them, in the old scheme (PID and a
// counter) and in this one, must neither stop the start nor stay.
TEST(G3Files, RestartUnderTheSamePidStarts) {
  TempDir dir;
  std::string pid = std::to_string(getpid());
  for (int i = 0; i < 512; ++i)  // the old scheme's counter, from this process's first manager
    touch(dir.path + "/kvtier-g3-" + pid + "-" + std::to_string(i) + ".bin");
  touch(dir.path + "/kvtier-g3-" + pid + "-0123456789abcdef.bin");
  touch(dir.path + "/unrelated.bin");
  touch(dir.path + "/kvtier-g3-notes.txt");
  auto m = make(g3_config(dir.path.c_str()));
  ASSERT_TRUE(m) << "a dead owner's name stopped the start";
  auto files = g3_files(dir.path);
  ASSERT_EQ(files.size(), 2u);  // this manager's, and the one that is not a G3 file
  EXPECT_EQ(std::count(files.begin(), files.end(), "kvtier-g3-notes.txt"), 1);
  EXPECT_EQ(std::filesystem::exists(dir.path + "/unrelated.bin"), true);
  EXPECT_EQ(g3_roundtrip(m.get(), 1, 4, 3), "");
}

// Two managers of one process in one directory never share a name.
TEST(G3Files, ManagersInOneDirectoryGetFilesOfTheirOwn) {
  TempDir dir;
  std::vector<ManagerPtr> ms;
  for (int i = 0; i < 8; ++i) ms.push_back(make(g3_config(dir.path.c_str(), 4)));
  EXPECT_EQ(g3_files(dir.path).size(), 8u);
  for (size_t i = 0; i < ms.size(); ++i)
    EXPECT_EQ(g3_roundtrip(ms[i].get(), 10 * i + 1, 2, uint32_t(i)), "") << i;
}

TEST(G3Files, KilledOwnersTemporaryDirectoryGoes) {
  TempDir tmp;
  ScopedTmpdir env(tmp.path);
  Owner live(nullptr);
  ASSERT_TRUE(live.ready());
  auto live_dirs = tmp.names();
  Owner dead(nullptr);
  ASSERT_TRUE(dead.ready());
  auto dead_dirs = minus(tmp.names(), live_dirs);
  ASSERT_EQ(live_dirs.size(), 1u);
  ASSERT_EQ(dead_dirs.size(), 1u);
  EXPECT_EQ(g3_files(tmp.path + "/" + dead_dirs[0]).size(), 1u);
  dead.kill9();
  // Neighbours that are not a dead manager's: another program's directory with a similar
  // name, and one of this user's holding something else.
  std::filesystem::create_directory(tmp.path + "/kvtier-other");
  std::filesystem::create_directory(tmp.path + "/kvtier-g3.keepme");
  touch(tmp.path + "/kvtier-g3.keepme/notes.txt");

  LogCapture log;
  auto m = make(g3_config(nullptr));
  ASSERT_TRUE(m);
  auto now = tmp.names();
  EXPECT_EQ(std::count(now.begin(), now.end(), dead_dirs[0]), 0) << "the dead owner's dir stays";
  EXPECT_EQ(std::count(now.begin(), now.end(), live_dirs[0]), 1) << "a live owner's dir went";
  EXPECT_EQ(g3_files(tmp.path + "/" + live_dirs[0]).size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(tmp.path + "/kvtier-other"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path + "/kvtier-g3.keepme/notes.txt"));
  EXPECT_EQ(log.find(KVT_LOG_INFO, dead_dirs[0]).size(), 2u)
      << "one line for the file, one for the dir";
  auto mine = minus(minus(now, live_dirs), {"kvtier-other", "kvtier-g3.keepme"});
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(g3_roundtrip(m.get(), 1, 4, 4), "");
  m.reset();
  EXPECT_FALSE(std::filesystem::exists(tmp.path + "/" + mine[0])) << "destroy removes its dir";
}

TEST(G3Files, EmptyPathIsRefused) {
  kvt_manager_config c = g3_config("");
  kvt_manager *m = nullptr;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(kvt_last_error()).find("g3_path"), std::string::npos) << kvt_last_error();
}

TEST(G3Files, MissingDirectoryFailsWithIoAndCreatesNothing) {
  TempDir dir;
  std::string missing = dir.path + "/not-there";
  kvt_manager_config c = g3_config(missing.c_str());
  kvt_manager *m = nullptr;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_IO);
  EXPECT_NE(std::string(kvt_last_error()).find(missing), std::string::npos) << kvt_last_error();
  EXPECT_TRUE(dir.names().empty());
}
