// The endpoint's Unix-domain socket file: who may connect, and one owner at a time. The
// socket is mode 0600 whatever the umask (0660 with an allowed group, 0666 with an allowed
// uid, where SO_PEERCRED then decides); "PATH.lock", flocked for the socket's life, tells a
// live owner from a dead one, so that a socket left by a killed process is replaced at the
// next start instead of refusing it ("Address already in use").
#pragma once

#include <cstdint>
#include <string>

#include "kvtier.h"

namespace kvt::obs {

struct SocketAccess {
  int64_t uid = -1;  // besides the process's own user and root: -1 none
  int64_t gid = -1;  // members of this group (primary or supplementary): -1 none
};

class SocketFile {
 public:
  ~SocketFile() { close(); }
  // Binds and listens on path; the error set on failure. A file at path is replaced only
  // when it is a socket that no live process holds (its lock is free and nothing accepts).
  kvt_status open(const std::string &path, const SocketAccess &access);
  // Removes the socket and its lock file, then closes both.
  void close() noexcept;
  int fd() const noexcept { return fd_; }
  // Whether the connected peer on fd may talk to us; why not in *why.
  bool admits(int fd, std::string *why) const;

 private:
  kvt_status lock(const std::string &lock_path);

  std::string path_, lock_path_;
  SocketAccess access_;
  int fd_ = -1, lock_fd_ = -1;
};

}  // namespace kvt::obs
