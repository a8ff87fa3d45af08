// G3's file on disk: its name, its lock, its preallocation, and the removal of files that
// dead processes left behind.
//
// A G3 file is named kvtier-g3-<pid>-<64 random bits>.bin, so that a process that reuses a
// dead one's PID (a restarted container) never meets its name. Its owner holds an
// exclusive flock on it for the file's whole life; the kernel drops the lock when the owner
// dies, however it dies. A manager that starts in a directory removes every G3 file there
// whose lock it can take (its owner is gone), and leaves locked ones alone. One lock per
// file, on the file itself, so that a file kept at a path the host chooses can use the
// same rule.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier.h"

namespace kvt {

class G3File {
 public:
  // Creates and preallocates a file of `bytes` in dir, after removing dead owners' files
  // there. dir NULL: a fresh directory under $TMPDIR (or /tmp), removed with the file; dead
  // owners' temporary directories are removed first. KVT_ERR_NO_SPACE when the filesystem
  // cannot hold `bytes`, KVT_ERR_IO otherwise; nothing is left behind on failure.
  static kvt_status create(std::unique_ptr<G3File> *out, const char *dir, uint64_t bytes);
  // Opens dir/kvtier-g3.bin, the file of a persistent G3, creating it empty where it is
  // absent, and takes its lock: KVT_ERR_STATE naming the holder when another manager (here
  // or in another process) has it open. *size is the file's size; 0 for a new file. The
  // file is kept at destruction. Stale files of dead owners in dir are removed first.
  static kvt_status open_persistent(std::unique_ptr<G3File> *out, const char *dir,
                                    uint64_t *size);
  // Empties the file and preallocates `bytes` of zeros (a new or reset persistent file).
  kvt_status reset(uint64_t bytes);
  // O_DIRECT where the filesystem takes it (create does this itself).
  kvt_status enable_direct();
  ~G3File();  // removes the file (and a temporary directory), unless persistent
  G3File(const G3File &) = delete;
  G3File &operator=(const G3File &) = delete;

  int fd() const noexcept { return fd_; }
  const std::string &path() const noexcept { return path_; }
  const std::string &dir() const noexcept { return dir_; }

 private:
  G3File() = default;
  kvt_status open_in(int dirfd);
  kvt_status preallocate(uint64_t bytes);

  std::string dir_, path_;
  bool own_dir_ = false, persistent_ = false;
  int fd_ = -1;
  uint64_t dev_ = 0, ino_ = 0;  // of the open file, so that a cleaner skips it
};

}  // namespace kvt
