#include "observe/socket_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59  // Linux 4.13; older headers lack the name
#endif

namespace kvt::obs {
namespace {

bool same_file(const struct stat &a, const struct stat &b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Whether a process accepts connections on the socket at a: a non-blocking connect fails
// with ECONNREFUSED when nobody listens, and with EAGAIN when a live one's backlog is full.
bool someone_listens(const sockaddr_un &a) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return true;  // cannot tell: assume alive, never remove a live one's socket
  const bool alive = connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a) == 0 ||
                     errno == EAGAIN || errno == EINPROGRESS;
  ::close(fd);
  return alive;
}

}  // namespace

kvt_status SocketFile::lock(const std::string &lock_path) {
  // The owner removes its lock file before letting go of it: a lock taken on a file that is
  // no longer the one at lock_path is retaken on the new one.
  for (int attempt = 0; attempt < 8; ++attempt) {
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                    0600);
    if (fd < 0)
      return fail(KVT_ERR_IO, "cannot open the lock file '%s': %s", lock_path.c_str(),
                  std::strerror(errno));
    struct stat held, now;
    if (fstat(fd, &held) != 0 || !S_ISREG(held.st_mode)) {
      ::close(fd);
      return fail(KVT_ERR_IO, "'%s' is not a regular file", lock_path.c_str());
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK)
        return fail(KVT_ERR_STATE, "'%s' is served by a live process (it holds '%s')",
                    path_.c_str(), lock_path.c_str());
      return fail(KVT_ERR_IO, "cannot lock '%s': %s", lock_path.c_str(), std::strerror(err));
    }
    if (lstat(lock_path.c_str(), &now) == 0 && same_file(held, now)) {
      lock_fd_ = fd;
      return KVT_OK;
    }
    ::close(fd);
  }
  return fail(KVT_ERR_STATE, "'%s' keeps being replaced by other processes", lock_path.c_str());
}

kvt_status SocketFile::open(const std::string &path, const SocketAccess &access) {
  sockaddr_un a{};
  if (path.empty() || path.size() >= sizeof a.sun_path)
    return fail(KVT_ERR_INVALID_ARGUMENT, "socket path '%s' is empty or longer than %zu bytes",
                path.c_str(), sizeof a.sun_path - 1);
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size());
  path_ = path;
  access_ = access;
  if (kvt_status st = lock(path + ".lock"); st != KVT_OK) return st;
  lock_path_ = path + ".lock";
  auto give_up = [&](kvt_status st) {
    unlink(lock_path_.c_str());
    ::close(lock_fd_);
    lock_fd_ = -1;
    return st;
  };

  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return give_up(fail(KVT_ERR_INVALID_ARGUMENT, "'%s' exists and is not a socket",
                          path.c_str()));
    if (someone_listens(a))
      return give_up(fail(KVT_ERR_STATE,
                          "'%s' is served by a process that holds no lock on '%s' (another "
                          "program, or an older kvtier)",
                          path.c_str(), lock_path_.c_str()));
    if (unlink(path.c_str()) != 0 && errno != ENOENT)
      return give_up(fail(KVT_ERR_IO, "cannot remove the stale socket '%s': %s", path.c_str(),
                          std::strerror(errno)));
    log(KVT_LOG_INFO, "endpoint: replaced '%s', left by a process that has ended",
        path.c_str());
  } else if (errno != ENOENT) {
    return give_up(fail(KVT_ERR_IO, "cannot stat '%s': %s", path.c_str(), std::strerror(errno)));
  }

  // The mode is set between bind and listen: until listen, every connect is refused, so
  // nobody gets in under the umask's mode.
  const mode_t mode = access.uid >= 0 ? 0666 : access.gid >= 0 ? 0660 : 0600;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const char *step = "socket";
  bool ok = fd >= 0;
  if (ok && !(ok = bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0)) step = "bind";
  if (ok && !(ok = chmod(path.c_str(), mode) == 0)) step = "chmod";
  if (ok && access.gid >= 0 && !(ok = chown(path.c_str(), uid_t(-1), gid_t(access.gid)) == 0))
    step = "give the group to";
  if (ok && !(ok = listen(fd, 64) == 0)) step = "listen on";
  if (!ok) {
    const int err = errno;
    if (fd >= 0) {
      if (std::strcmp(step, "bind") != 0) unlink(path.c_str());
      ::close(fd);
    }
    return give_up(fail(KVT_ERR_IO, "cannot %s '%s': %s", step, path.c_str(),
                        std::strerror(err)));
  }
  fd_ = fd;
  return KVT_OK;
}

void SocketFile::close() noexcept {
  if (fd_ >= 0) {
    unlink(path_.c_str());
    ::close(fd_);
    fd_ = -1;
  }
  if (lock_fd_ >= 0) {
    unlink(lock_path_.c_str());  // while still holding it: see lock()
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

bool SocketFile::admits(int fd, std::string *why) const {
  ucred cr{};
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
    *why = std::string("no peer credentials: ") + std::strerror(errno);
    return false;
  }
  if (cr.uid == 0 || cr.uid == geteuid()) return true;
  if (access_.uid >= 0 && cr.uid == uid_t(access_.uid)) return true;
  if (access_.gid >= 0) {
    if (cr.gid == gid_t(access_.gid)) return true;
    gid_t groups[256];
    socklen_t glen = sizeof groups;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
      for (size_t i = 0; i < glen / sizeof(gid_t); ++i)
        if (groups[i] == gid_t(access_.gid)) return true;
  }
  *why = "uid " + std::to_string(cr.uid) + " (gid " + std::to_string(cr.gid) +
         ") may not use this endpoint";
  return false;
}

}  // namespace kvt::obs
