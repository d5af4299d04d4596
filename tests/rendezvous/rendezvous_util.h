// What the rendezvous tests share: whether torch is in DLM_PYTHON's environment, and a closed port.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace dlm::test {

inline bool torch_present() {
  return std::system((std::string(DLM_PYTHON) + " -c 'import torch.distributed.run' 2>/dev/null").c_str()) == 0;
}

// A port nobody listens on (bound, then released).
inline int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace dlm::test
