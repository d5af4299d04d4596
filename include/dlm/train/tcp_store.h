// A client of PyTorch's c10d TCPStore: the key-value store torchrun's agent hosts at MASTER_ADDR:MASTER_PORT,
// through which ranks launched by torchrun meet (Gloo's rendezvous, NCCL's unique id, the roll call).
//
// Wire protocol (torch/csrc/distributed/c10d/TCPStore.cpp and store/TCPStoreBackend.hpp, torch 2.x), host
// byte order (little-endian), one TCP connection per client, one request answered at a time:
//   request   = u8 query, then its arguments; string = u64 length, bytes
//   VALIDATE  0: u32 0x3C85F7CE                       (sent first on connecting; no answer)
//   SET       1: key, value                          (no answer)
//   GET       3: key                 -> u64 length, bytes   (the key must exist: WAIT first)
//   ADD       4: key, i64 delta      -> i64 new value       (the value is kept as decimal text)
//   CHECK     5: u64 count, keys     -> u8 0 all present, 1 not
//   WAIT      6: u64 count, keys     -> u8 0 once all are present
//   CANCEL_WAIT 12                   -> u8 1 (after a 0 if the keys arrived meanwhile)
//   PING     13: u32 nonce           -> u32 the same nonce
// A key goes on the wire as torch's client sends it, "/" + prefix + key (torch.distributed.PrefixStore("run7", s)
// reads dlm's "run7/" keys), so runs (torchrun's restarts) sharing one store never meet.
// Every call is bounded by the timeout; a store that cannot be reached or answers nothing is a one-line
// dlm::Error naming the address and the caller ("rank 1").
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace dlm::train {

class TcpStore {
 public:
  // Connects (retrying until `timeout_seconds`, as the store may start after its clients), then validates
  // and pings. `who` names this process in errors ("rank 1").
  TcpStore(std::string host, int port, std::string prefix, double timeout_seconds, std::string who);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, std::span<const std::uint8_t> value);
  void set(const std::string& key, const std::string& value);
  // Waits for the key (up to the timeout), then reads it.
  std::vector<std::uint8_t> get(const std::string& key);
  std::int64_t add(const std::string& key, std::int64_t delta);
  bool check(const std::vector<std::string>& keys);
  // Until every key exists; dlm::Error naming the keys after `timeout_seconds` (the store's own timeout
  // when negative).
  void wait(const std::vector<std::string>& keys, double timeout_seconds = -1);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  const std::string& prefix() const { return prefix_; }
  double timeout_seconds() const { return timeout_seconds_; }
  // "localhost:29500 (MASTER_ADDR:MASTER_PORT)", for messages.
  const std::string& address() const { return address_; }

 private:
  void send(const std::vector<std::uint8_t>& bytes, const char* what);
  void receive(void* data, std::size_t size, double timeout_seconds, const char* what);
  bool readable(double timeout_seconds);
  [[noreturn]] void lost(const std::string& what, const std::string& why) const;
  template <typename T>
  T receive_value(const char* what) {
    T value{};
    receive(&value, sizeof value, timeout_seconds_, what);
    return value;
  }
  std::vector<std::uint8_t> request(std::uint8_t query) const;
  void append_key(std::vector<std::uint8_t>& bytes, const std::string& key) const;

  std::string host_;
  int port_;
  std::string prefix_, address_, who_;
  double timeout_seconds_;
  int socket_ = -1;
  std::mutex mutex_;
};

}  // namespace dlm::train
