// G3's two I/O paths (src/copy/disk_io.cpp, compiled into the tests) let batches from
// two threads run at once: a batch whose reads wait on a pipe must not stop another thread's
// batch, which writes what they wait for. With a lock held for a whole batch, as before,
// this deadlocks.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "support.hpp"
#include "copy/disk_io.hpp"

using kvt::IoRequest;

namespace {

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int p[2];
    if (pipe2(p, O_CLOEXEC) == 0) r = p[0], w = p[1];
  }
  ~Pipe() {
    if (r >= 0) close(r);
    if (w >= 0) close(w);
  }
};

// Two requests of 8 bytes (two iovecs of 4) at the pipe's own position.
std::vector<IoRequest> requests(bool write, char *buf) {
  std::vector<IoRequest> v(2);
  for (int i = 0; i < 2; ++i) {
    v[i].write = write;
    v[i].offset = -1;
    v[i].iov[0] = {buf + 8 * i, 4};
    v[i].iov[1] = {buf + 8 * i + 4, 4};
  }
  return v;
}

// valgrind (KVTIER_TEST_G3_IO=threads) neither sees io_uring's writes nor lets another
// thread run while one waits in io_uring_enter.
bool uring_wanted() { return kvt_test::test_g3_io(KVT_IO_AUTO) == KVT_IO_AUTO; }

// Reader and writer on two threads through `run`; the reader starts first and blocks.
template <class Run>
void expect_overlap(Run run) {
  Pipe p;
  ASSERT_GE(p.r, 0);
  char in[16] = {}, out[17] = "0123456789abcdef";
  auto rd = requests(false, in), wr = requests(true, out);
  auto reader = std::async(std::launch::async, [&] { run(p.r, rd.data(), rd.size()); });
  ASSERT_EQ(reader.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "the reads did not wait for the pipe";
  auto writer = std::async(std::launch::async, [&] { run(p.w, wr.data(), wr.size()); });
  bool wrote = writer.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!wrote) {  // unblock both, so that the test ends, and fail
    char junk[16] = {};
    EXPECT_EQ(write(p.w, junk, sizeof junk), 16);
  }
  EXPECT_TRUE(wrote) << "the writer's batch waited for the reader's: no overlap";
  EXPECT_EQ(reader.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  writer.wait();
  reader.wait();
  if (!wrote) return;
  for (auto &x : wr) EXPECT_EQ(x.result, 8);
  for (auto &x : rd) EXPECT_EQ(x.result, 8);
  std::string got(in, 16);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, "0123456789abcdef");
}

}  // namespace

TEST(Threads, G3IoThreadsOverlapBatches) {
  kvt::IoThreads io(1);  // one I/O thread, busy with a read; the callers do the rest
  expect_overlap([&](int fd, IoRequest *r, size_t n) { io.run(fd, r, n); });
}

TEST(Threads, G3RingsOverlapBatches) {
  if (!uring_wanted()) GTEST_SKIP() << "KVTIER_TEST_G3_IO=threads: no io_uring in this run";
  std::unique_ptr<kvt::RingPool> rings;
  if (int e = kvt::RingPool::create(&rings, 2); e != 0)
    GTEST_SKIP() << "io_uring is unavailable here: " << std::strerror(-e);
  expect_overlap([&](int fd, IoRequest *r, size_t n) { rings->run(fd, r, n); });
}

// A ring pool allowed one ring shares it: the second batch waits for the first, then runs.
TEST(Threads, G3OneRingIsShared) {
  if (!uring_wanted()) GTEST_SKIP() << "KVTIER_TEST_G3_IO=threads: no io_uring in this run";
  std::unique_ptr<kvt::RingPool> rings;
  if (int e = kvt::RingPool::create(&rings, 1); e != 0)
    GTEST_SKIP() << "io_uring is unavailable here: " << std::strerror(-e);
  char a[16] = {}, b[16] = {};
  int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::memset(a, 1, sizeof a);
  std::memset(b, 1, sizeof b);
  auto ra = requests(false, a), rb = requests(false, b);
  for (auto *v : {&ra, &rb})
    for (auto &x : *v) x.offset = 0;
  auto t1 = std::async(std::launch::async, [&] { rings->run(fd, ra.data(), ra.size()); });
  auto t2 = std::async(std::launch::async, [&] { rings->run(fd, rb.data(), rb.size()); });
  t1.wait();
  t2.wait();
  close(fd);
  for (auto *v : {&ra, &rb})
    for (auto &x : *v) EXPECT_EQ(x.result, 8);
  EXPECT_EQ(std::string(a, 16), std::string(16, '\0'));
  EXPECT_EQ(std::string(b, 16), std::string(16, '\0'));
}
