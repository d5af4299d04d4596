// The c10d TCPStore client (see include/dlm/train/tcp_store.h): blocking sockets, every read polled against
// a deadline.
#include "dlm/train/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "dlm/train/communicator.h"

namespace dlm::train {
namespace {

using Clock = std::chrono::steady_clock;

enum Query : std::uint8_t { kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kCheck = 5, kWait = 6, kCancelWait = 12, kPing = 13 };
constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
constexpr std::uint8_t kReady = 0, kStopWaiting = 0, kWaitCanceled = 1;

template <typename T>
void append(std::vector<std::uint8_t>& bytes, T value) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
  bytes.insert(bytes.end(), p, p + sizeof value);
}

void append_bytes(std::vector<std::uint8_t>& bytes, const void* data, std::size_t size) {
  append<std::uint64_t>(bytes, size);
  const auto* p = static_cast<const std::uint8_t*>(data);
  bytes.insert(bytes.end(), p, p + size);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One connection attempt to every address of host:port; -1 and errno's text in `why` when none answers.
int connect_once(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    why = ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, std::string prefix, double timeout_seconds, std::string who)
    : host_(host),
      port_(port),
      prefix_(std::move(prefix)),
      address_(fmt::format("{}:{} (MASTER_ADDR:MASTER_PORT)", host, port)),
      who_(std::move(who)),
      timeout_seconds_(timeout_seconds) {
  if (!(timeout_seconds > 0)) fail("the store's timeout must be positive");
  const auto begin = Clock::now();
  std::string why = "no address";
  auto nap = std::chrono::milliseconds(10);
  while ((socket_ = connect_once(host, port, why)) < 0) {
    if (seconds_since(begin) > timeout_seconds_)
      fail(fmt::format("{}: the c10d store at {} was not reachable within {:g} s: {}", who_, address_, timeout_seconds_, why));
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::milliseconds(500));
  }
  auto validate = request(kValidate);
  append<std::uint32_t>(validate, kValidationMagic);
  send(validate, "validate");
  auto ping = request(kPing);
  const auto nonce = static_cast<std::uint32_t>(::getpid());
  append<std::uint32_t>(ping, nonce);
  send(ping, "ping");
  if (receive_value<std::uint32_t>("ping") != nonce) lost("ping", "the store answered another nonce (not a c10d TCPStore?)");
}

TcpStore::~TcpStore() {
  if (socket_ >= 0) ::close(socket_);
}

std::vector<std::uint8_t> TcpStore::request(std::uint8_t query) const { return {query}; }

void TcpStore::append_key(std::vector<std::uint8_t>& bytes, const std::string& key) const {
  const std::string full = "/" + prefix_ + key;  // torch's TCPStore sends every key after a "/"
  append_bytes(bytes, full.data(), full.size());
}

void TcpStore::lost(const std::string& what, const std::string& why) const {
  throw CommunicationError(fmt::format("{}: the c10d store at {}: {}: {}", who_, address_, what, why));
}

void TcpStore::send(const std::vector<std::uint8_t>& bytes, const char* what) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(socket_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) lost(what, n < 0 ? std::strerror(errno) : "the connection closed");
    done += static_cast<std::size_t>(n);
  }
}

bool TcpStore::readable(double timeout_seconds) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    pollfd p{socket_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::clamp(left * 1000.0, 0.0, 1e9)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) lost("poll", std::strerror(errno));
    if (rc == 0 && left <= 0) return false;
  }
}

void TcpStore::receive(void* data, std::size_t size, double timeout_seconds, const char* what) {
  auto* p = static_cast<std::uint8_t*>(data);
  std::size_t done = 0;
  while (done < size) {
    if (!readable(timeout_seconds)) lost(what, fmt::format("no answer within {:g} s", timeout_seconds));
    const ssize_t n = ::recv(socket_, p + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) lost(what, n < 0 ? std::strerror(errno) : "the connection closed (the store's host exited?)");
    done += static_cast<std::size_t>(n);
  }
}

void TcpStore::set(const std::string& key, std::span<const std::uint8_t> value) {
  std::lock_guard lock(mutex_);
  auto bytes = request(kSet);
  append_key(bytes, key);
  append_bytes(bytes, value.data(), value.size());
  send(bytes, "set");
}

void TcpStore::set(const std::string& key, const std::string& value) {
  set(key, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(value.data()), value.size()));
}

std::vector<std::uint8_t> TcpStore::get(const std::string& key) {
  wait({key});
  std::lock_guard lock(mutex_);
  auto bytes = request(kGet);
  append_key(bytes, key);
  send(bytes, "get");
  std::vector<std::uint8_t> value(receive_value<std::uint64_t>("get"));
  receive(value.data(), value.size(), timeout_seconds_, "get");
  return value;
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  std::lock_guard lock(mutex_);
  auto bytes = request(kAdd);
  append_key(bytes, key);
  append<std::int64_t>(bytes, delta);
  send(bytes, "add");
  return receive_value<std::int64_t>("add");
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  auto bytes = request(kCheck);
  append<std::uint64_t>(bytes, keys.size());
  for (const auto& k : keys) append_key(bytes, k);
  send(bytes, "check");
  return receive_value<std::uint8_t>("check") == kReady;
}

void TcpStore::wait(const std::vector<std::string>& keys, double timeout_seconds) {
  std::lock_guard lock(mutex_);
  if (timeout_seconds < 0) timeout_seconds = timeout_seconds_;
  auto bytes = request(kWait);
  append<std::uint64_t>(bytes, keys.size());
  for (const auto& k : keys) append_key(bytes, k);
  send(bytes, "wait");
  if (readable(timeout_seconds)) {
    if (receive_value<std::uint8_t>("wait") != kStopWaiting) lost("wait", "an unexpected answer");
    return;
  }
  // Cancelled: the store answers WAIT_CANCELED, after a STOP_WAITING if the keys came meanwhile.
  send(request(kCancelWait), "cancel_wait");
  if (receive_value<std::uint8_t>("cancel_wait") != kWaitCanceled && receive_value<std::uint8_t>("cancel_wait") != kWaitCanceled)
    lost("cancel_wait", "an unexpected answer");
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "" : ", ") + prefix_ + k;
  lost("wait", fmt::format("{} not set within {:g} s", names, timeout_seconds));
}

}  // namespace dlm::train
