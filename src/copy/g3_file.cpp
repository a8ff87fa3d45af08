#include "copy/g3_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <utility>

#include "common/error.hpp"
#include "common/log.hpp"
#include "memory/mapping.hpp"

namespace kvt {

namespace {
constexpr char kFilePrefix[] = "kvtier-g3-";
constexpr char kFileSuffix[] = ".bin";
constexpr char kDirPrefix[] = "kvtier-g3.";
constexpr char kPersistentName[] = "kvtier-g3.bin";
constexpr int kAttempts = 16;
constexpr uint64_t kZeroChunk = uint64_t{1} << 20;
unsigned long long ull(uint64_t v) { return v; }

// The files this process's managers hold. flock keeps a live owner's file safe from other
// processes, and from this one on local filesystems; this set also covers filesystems
// (NFS) where flock is a per-process POSIX lock that this process could take twice.
// Never freed, so that a manager destroyed during static destruction still finds it.
struct LiveFiles {
  std::mutex mu;
  std::set<std::pair<uint64_t, uint64_t>> files;
};
LiveFiles &live() {
  static auto *l = new LiveFiles;
  return *l;
}

bool live_here(const struct stat &st) {
  std::lock_guard lock(live().mu);
  return live().files.count({st.st_dev, st.st_ino}) != 0;
}

bool is_g3_name(const char *name) {
  size_t n = std::strlen(name), p = sizeof kFilePrefix - 1, s = sizeof kFileSuffix - 1;
  return n > p + s && std::strncmp(name, kFilePrefix, p) == 0 &&
         std::strcmp(name + n - s, kFileSuffix) == 0;
}

uint64_t random64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == ssize_t(sizeof v)) return v;
  // No entropy yet (early boot): the clock and an address still differ between processes.
  static std::atomic<uint64_t> serial{0};
  return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         (uint64_t(getpid()) << 40) ^ (serial.fetch_add(1) * 0x9e3779b97f4a7c15ULL) ^
         reinterpret_cast<uintptr_t>(&v);
}

std::string file_name() {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%d-%016llx%s", kFilePrefix, int(getpid()), ull(random64()),
                kFileSuffix);
  return buf;
}

// Removes the G3 files in dirfd whose owner is dead: those whose lock can be taken. The
// file is removed while the lock is held, and only if the name still leads to the file that
// was locked. Returns how many it removed.
unsigned remove_stale(int dirfd, const std::string &dir) {
  int dup = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return 0;
  DIR *d = fdopendir(dup);
  if (d == nullptr) {
    close(dup);
    return 0;
  }
  unsigned removed = 0;
  while (dirent *e = readdir(d)) {
    if (!is_g3_name(e->d_name) || (e->d_type != DT_REG && e->d_type != DT_UNKNOWN)) continue;
    int fd = openat(dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) continue;  // another user's, or gone already
    struct stat st, now;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !live_here(st) &&
        flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        fstatat(dirfd, e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == st.st_dev &&
        now.st_ino == st.st_ino && unlinkat(dirfd, e->d_name, 0) == 0) {
      ++removed;
      kvt::log(KVT_LOG_INFO,
          "G3: removed %s/%s (%llu bytes), left by a process that ended without destroying "
          "its manager",
          dir.c_str(), e->d_name, ull(uint64_t(st.st_size)));
    }
    close(fd);
  }
  closedir(d);
  return removed;
}

// Removes this user's temporary G3 directories under root whose owner is dead: their G3
// files go as above, then the directory if that left it empty. A live owner's directory
// keeps its locked file, so it is never empty; one that a live manager has just made and
// not yet filled may go, and that manager then makes another.
void remove_stale_temp_dirs(const std::string &root) {
  int rootfd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) return;
  int dup = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
  DIR *d = dup < 0 ? nullptr : fdopendir(dup);
  if (d == nullptr) {
    if (dup >= 0) close(dup);
    close(rootfd);
    return;
  }
  while (dirent *e = readdir(d)) {
    if (std::strncmp(e->d_name, kDirPrefix, sizeof kDirPrefix - 1) != 0 ||
        (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN))
      continue;
    int dfd = openat(rootfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) continue;
    struct stat st;
    bool mine = fstat(dfd, &st) == 0 && st.st_uid == geteuid();
    std::string path = root + "/" + e->d_name;
    if (mine) remove_stale(dfd, path);
    close(dfd);
    if (mine && unlinkat(rootfd, e->d_name, AT_REMOVEDIR) == 0)
      kvt::log(KVT_LOG_INFO,
          "G3: removed %s, the temporary directory of a process that ended without destroying "
          "its manager",
          path.c_str());
  }
  closedir(d);
  close(rootfd);
}

std::string temp_root() {
  const char *t = std::getenv("TMPDIR");  // the one variable the library reads
  return t != nullptr && *t != '\0' ? t : "/tmp";
}

kvt_status no_space(const std::string &path, uint64_t bytes, int err) {
  return fail(KVT_ERR_NO_SPACE, "G3: no room for a %llu-byte file at %s: %s", ull(bytes),
              path.c_str(), std::strerror(err));
}

bool out_of_space(int err) { return err == ENOSPC || err == EDQUOT || err == EFBIG; }

// The process holding a flock on the file st describes, from /proc/locks: its PID, or 0
// when none is shown (a holder that has died, or one in another PID namespace).
long lock_holder(const struct stat &st) {
  FILE *f = std::fopen("/proc/locks", "re");
  if (f == nullptr) return 0;
  char line[256];
  long pid = 0;
  while (pid == 0 && std::fgets(line, sizeof line, f) != nullptr) {
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; waiters' lines carry "->".
    char type[16], mode[16], rw[16];
    long p;
    unsigned maj, min;
    unsigned long long ino;
    const char *rest = std::strchr(line, ':');
    if (rest == nullptr || std::strstr(line, "->") != nullptr) continue;
    if (std::sscanf(rest + 1, "%15s %15s %15s %ld %x:%x:%llu", type, mode, rw, &p, &maj, &min,
                    &ino) == 7 &&
        std::strcmp(type, "FLOCK") == 0 && ino == st.st_ino && maj == major(st.st_dev) &&
        min == minor(st.st_dev))
      pid = p > 0 ? p : 0;
  }
  std::fclose(f);
  return pid;
}
}  // namespace

kvt_status G3File::open_persistent(std::unique_ptr<G3File> *out, const char *dir,
                                   uint64_t *size) {
  std::unique_ptr<G3File> f(new G3File);
  f->dir_ = dir;
  f->path_ = f->dir_ + "/" + kPersistentName;
  f->persistent_ = true;
  int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0)
    return fail(KVT_ERR_IO, "G3: cannot open the directory %s: %s", dir, std::strerror(errno));
  remove_stale(dirfd, f->dir_);
  int fd = openat(dirfd, kPersistentName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  int err = errno;
  close(dirfd);
  if (fd < 0)
    return fail(KVT_ERR_IO, "G3: cannot open %s: %s", f->path_.c_str(), std::strerror(err));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return fail(KVT_ERR_IO, "G3: %s is not a regular file", f->path_.c_str());
  }
  bool held_here = live_here(st);
  long pid = 0;
  // A killed owner's lock can outlive it briefly (its io_uring rings close in the kernel's
  // own time): while no live holder is to be seen, wait for the lock, up to 2 s.
  bool locked = false;
  for (int wait = 0; !held_here; ++wait) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      locked = true;
      break;
    }
    err = errno;
    pid = err == EWOULDBLOCK ? lock_holder(st) : 0;
    bool gone = pid == 0 || (kill(pid_t(pid), 0) != 0 && errno == ESRCH);
    if (!gone || wait == 200) break;
    usleep(10000);
  }
  if (!locked) {
    if (held_here) pid = long(getpid());
    close(fd);
    if (held_here || err == EWOULDBLOCK) {
      if (pid > 0)
        return fail(KVT_ERR_STATE, "G3: %s is in use by another manager (process %ld holds its lock)",
                    f->path_.c_str(), pid);
      return fail(KVT_ERR_STATE,
                  "G3: %s is in use by another manager (a process not visible from here holds "
                  "its lock)",
                  f->path_.c_str());
    }
    return fail(KVT_ERR_IO, "G3: cannot lock %s: %s; a persistent G3 needs flock to keep one "
                "owner", f->path_.c_str(), std::strerror(err));
  }
  f->fd_ = fd;
  f->dev_ = st.st_dev;
  f->ino_ = st.st_ino;
  {
    std::lock_guard lock(live().mu);
    live().files.insert({f->dev_, f->ino_});
  }
  *size = uint64_t(st.st_size);
  *out = std::move(f);
  return KVT_OK;
}

kvt_status G3File::reset(uint64_t bytes) {
  if (ftruncate(fd_, 0) != 0)
    return fail(KVT_ERR_IO, "G3: cannot empty %s: %s", path_.c_str(), std::strerror(errno));
  return preallocate(bytes);
}

kvt_status G3File::create(std::unique_ptr<G3File> *out, const char *dir, uint64_t bytes) {
  std::unique_ptr<G3File> f(new G3File);
  if (dir == nullptr) remove_stale_temp_dirs(temp_root());
  for (int attempt = 0;; ++attempt) {
    if (dir != nullptr) {
      f->dir_ = dir;
    } else {
      std::string tmpl = temp_root() + "/" + kDirPrefix + "XXXXXX";  // mkdtemp's template
      if (mkdtemp(tmpl.data()) == nullptr)
        return fail(KVT_ERR_IO, "G3: cannot create a temporary directory %s: %s", tmpl.c_str(),
                    std::strerror(errno));
      f->dir_ = tmpl;
      f->own_dir_ = true;
    }
    int dirfd = open(f->dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
      return fail(KVT_ERR_IO, "G3: cannot open the directory %s: %s", f->dir_.c_str(),
                  std::strerror(errno));
    if (dir != nullptr) remove_stale(dirfd, f->dir_);
    kvt_status s = f->open_in(dirfd);
    close(dirfd);
    if (s == KVT_OK) break;
    // KVT_AGAIN: another manager's cleanup removed the fresh temporary directory.
    if (s != KVT_AGAIN || attempt + 1 == kAttempts) {
      if (s == KVT_AGAIN)
        s = fail(KVT_ERR_IO, "G3: cannot create a file in %s: %s", f->dir_.c_str(),
                 std::strerror(ENOENT));
      return s;
    }
    std::error_code ec;
    std::filesystem::remove_all(f->dir_, ec);
    f->own_dir_ = false;
  }
  if (kvt_status s = f->enable_direct(); s != KVT_OK) return s;
  if (kvt_status s = f->preallocate(bytes); s != KVT_OK) return s;
  *out = std::move(f);
  return KVT_OK;
}

// Creates a fresh name and takes its lock. A cleaner in another manager may lock and remove
// a file between its creation and this lock; then it is given up for a new name.
kvt_status G3File::open_in(int dirfd) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    std::string name = file_name();
    int fd = openat(dirfd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      if (errno == ENOENT && own_dir_) return KVT_AGAIN;
      return fail(KVT_ERR_IO, "G3: cannot create %s/%s: %s", dir_.c_str(), name.c_str(),
                  std::strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {  // a cleaner holds it, and removes it
        close(fd);
        continue;
      }
      // A filesystem without locks: the file works, but a crash leaves it behind.
      kvt::log(KVT_LOG_WARN, "G3: cannot lock %s/%s (%s): if this process dies, nothing removes it",
          dir_.c_str(), name.c_str(), std::strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_nlink == 0) {  // removed before the lock was taken
      close(fd);
      if (own_dir_) return KVT_AGAIN;  // the directory may have gone with it
      continue;
    }
    fd_ = fd;
    path_ = dir_ + "/" + name;
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    std::lock_guard lock(live().mu);
    live().files.insert({dev_, ino_});
    return KVT_OK;
  }
  return fail(KVT_ERR_IO, "G3: cannot create a file of its own in %s", dir_.c_str());
}

// O_DIRECT keeps G3 out of the page cache. Some filesystems (ramfs, tmpfs before Linux 6.6)
// refuse it: the file is created without it and switched over where the filesystem allows.
kvt_status G3File::enable_direct() {
  int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0 && fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0) return KVT_OK;
  kvt::log(KVT_LOG_WARN, "G3: %s does not take O_DIRECT (%s); G3 uses buffered I/O there",
      dir_.c_str(), std::strerror(errno));
  return KVT_OK;
}

// Reserves the file's blocks now, so that a full disk fails here rather than on a write.
// Without fallocate (ext2, ramfs) it writes zeros, in aligned chunks that O_DIRECT takes.
kvt_status G3File::preallocate(uint64_t bytes) {
  int r;
  while ((r = fallocate(fd_, 0, 0, off_t(bytes))) != 0 && errno == EINTR) {
  }
  if (r == 0) return KVT_OK;
  int err = errno;
  if (out_of_space(err)) return no_space(path_, bytes, err);
  if (err != EOPNOTSUPP && err != ENOSYS)
    return fail(KVT_ERR_IO, "G3: cannot preallocate %llu bytes for %s: %s", ull(bytes),
                path_.c_str(), std::strerror(err));
  struct statvfs vfs;
  if (fstatvfs(fd_, &vfs) == 0 && vfs.f_blocks != 0 &&  // ramfs reports no size at all
      uint64_t(vfs.f_bavail) * vfs.f_frsize < bytes)
    return fail(KVT_ERR_NO_SPACE, "G3: no room for a %llu-byte file at %s: %llu bytes free",
                ull(bytes), path_.c_str(), ull(uint64_t(vfs.f_bavail) * vfs.f_frsize));
  uint64_t chunk = std::min(bytes, kZeroChunk);
  AlignedBuffer zeros = aligned_buffer(chunk);
  std::memset(zeros.get(), 0, chunk);
  for (uint64_t off = 0; off < bytes;) {
    size_t n = size_t(std::min(chunk, bytes - off));
    ssize_t w = pwrite(fd_, zeros.get(), n, off_t(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && !out_of_space(errno))
      return fail(KVT_ERR_IO, "G3: cannot fill %s with zeros at offset %llu: %s", path_.c_str(),
                  ull(off), std::strerror(errno));
    // A regular file takes a write whole unless space or a size limit runs out.
    if (w < ssize_t(n)) return no_space(path_, bytes, w < 0 ? errno : ENOSPC);
    off += n;
  }
  return KVT_OK;
}

G3File::~G3File() {
  if (fd_ >= 0) {
    if (!persistent_) unlink(path_.c_str());  // before the lock goes: no cleaner meets it
    close(fd_);
    std::lock_guard lock(live().mu);
    live().files.erase({dev_, ino_});
  }
  if (own_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

}  // namespace kvt
