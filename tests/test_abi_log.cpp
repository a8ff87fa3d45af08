// kvt_log_set_callback: messages at or below the level reach the host's callback with its
// user_data; nothing below the level, nothing when off (level 0 or fn NULL). The message
// provoked here is real: G3 removing a file left behind by a process that died without
// destroying its manager (an unlocked G3 file), which the library reports at INFO.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "support.hpp"

using namespace kvt_test;

namespace {

struct Message {
  int level;
  std::string text;
};

struct Sink {
  std::mutex mu;
  std::vector<Message> got;
  static void fn(int level, const char *message, void *user_data) {
    auto *s = static_cast<Sink *>(user_data);
    std::lock_guard lock(s->mu);
    s->got.push_back({level, message});
  }
  size_t count_with(const std::string &needle) {
    std::lock_guard lock(mu);
    size_t n = 0;
    for (const Message &m : got) n += m.text.find(needle) != std::string::npos;
    return n;
  }
};

class AbiLog : public ::testing::Test {
 protected:
  void SetUp() override {
    const char *tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvtier-log-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    kvt_log_set_callback(KVT_LOG_OFF, nullptr, nullptr);
    std::filesystem::remove_all(dir_);
  }

  // Leaves a G3 file as a killed process would (nobody holds its lock), then starts a
  // manager with G3 in the same directory, which removes it. Returns the file's name.
  std::string provoke_stale_file_removal() {
    const std::string name = "kvtier-g3-1-00000000deadbeef.bin";
    const std::string path = dir_ + "/" + name;
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, "left", 4), 4);
    close(fd);
    kvt_manager_config c = small_config(4, 4, 4);
    c.copy_threads = 1;
    c.g3_path = dir_.c_str();
    ManagerPtr m = make(c);
    EXPECT_FALSE(std::filesystem::exists(path)) << "the stale G3 file was not removed";
    return name;
  }

  std::string dir_;
};

}  // namespace

TEST_F(AbiLog, MessagesAtOrBelowTheLevelReachTheCallbackWithUserData) {
  Sink sink;
  kvt_log_set_callback(KVT_LOG_INFO, &Sink::fn, &sink);
  const std::string name = provoke_stale_file_removal();
  ASSERT_EQ(sink.count_with(name), 1u);
  std::lock_guard lock(sink.mu);
  for (const Message &m : sink.got) {
    EXPECT_GE(m.level, KVT_LOG_ERROR);
    EXPECT_LE(m.level, KVT_LOG_INFO) << m.text;
    if (m.text.find(name) != std::string::npos) {
      EXPECT_EQ(m.level, KVT_LOG_INFO);
      EXPECT_NE(m.text.find("removed"), std::string::npos) << m.text;
    }
  }
}

TEST_F(AbiLog, NothingBelowTheLevelIsDelivered) {
  Sink sink;
  kvt_log_set_callback(KVT_LOG_WARN, &Sink::fn, &sink);
  const std::string name = provoke_stale_file_removal();
  EXPECT_EQ(sink.count_with(name), 0u);
  std::lock_guard lock(sink.mu);
  for (const Message &m : sink.got) EXPECT_LE(m.level, KVT_LOG_WARN) << m.text;
}

TEST_F(AbiLog, LevelZeroOrNoCallbackTurnsItOff) {
  Sink sink;
  kvt_log_set_callback(KVT_LOG_OFF, &Sink::fn, &sink);
  provoke_stale_file_removal();
  kvt_log_set_callback(KVT_LOG_DEBUG, nullptr, &sink);
  provoke_stale_file_removal();
  // On, then off again.
  kvt_log_set_callback(KVT_LOG_DEBUG, &Sink::fn, &sink);
  kvt_log_set_callback(KVT_LOG_OFF, &Sink::fn, &sink);
  provoke_stale_file_removal();
  std::lock_guard lock(sink.mu);
  EXPECT_TRUE(sink.got.empty()) << sink.got.front().text;
}

// 0.4.0's name (kvtier.h, "Deprecated names") sets the same callback.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(AbiLog, TheDeprecatedNameSetsTheSameCallback) {
  Sink sink;
  kvt_set_log_callback(KVT_LOG_INFO, &Sink::fn, &sink);
  EXPECT_EQ(sink.count_with(provoke_stale_file_removal()), 1u);
  kvt_set_log_callback(KVT_LOG_OFF, nullptr, nullptr);
  EXPECT_EQ(sink.count_with(provoke_stale_file_removal()), 1u) << "off, and still delivered";
}
#pragma GCC diagnostic pop
