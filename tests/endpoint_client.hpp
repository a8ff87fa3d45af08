// A one-shot client of the management endpoint, for the tests that drive it.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <string>

// One request to a management endpoint at path, and its reply line ("" when none came).
inline std::string ask_endpoint(const std::string &path, const std::string &line) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      write(fd, line.data(), line.size()) == ssize_t(line.size())) {
    char ch;
    pollfd p{fd, POLLIN, 0};
    while (poll(&p, 1, 5000) == 1 && read(fd, &ch, 1) == 1 && ch != '\n') reply += ch;
  }
  close(fd);
  return reply;
}
