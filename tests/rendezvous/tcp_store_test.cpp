// dlm's c10d TCPStore client against the real one: Python torch hosts torch.distributed.TCPStore
// (tcp_store_peer.py); dlm's client reads torch's keys (get, add, check, wait) and writes keys torch reads
// back through its PrefixStore. Skipped without torch in DLM_PYTHON's environment.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/common/error.h"
#include "dlm/train/tcp_store.h"
#include "rendezvous_util.h"

namespace dlm::test {
namespace {

namespace fs = std::filesystem;
using train::TcpStore;

std::string text(const std::vector<std::uint8_t>& v) { return std::string(v.begin(), v.end()); }

TEST(TcpStore, ExchangesKeysWithTorchsTcpStore) {
  if (!torch_present()) GTEST_SKIP() << "no torch in " << DLM_PYTHON;
  const fs::path dir = fs::temp_directory_path() / ("dlm-tcp-store-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path port_file = dir / "port", err = dir / "peer.err";
  const pid_t peer = spawn({DLM_PYTHON, DLM_SOURCE_DIR "/tests/rendezvous/tcp_store_peer.py", port_file.string()}, err.string());
  for (int i = 0; i < 600 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(port_file)) << read_all(err);
  int port = 0;
  std::ifstream(port_file) >> port;

  TcpStore store("127.0.0.1", port, "run7/", 30, "rank 1");
  EXPECT_EQ(text(store.get("from_torch")), std::string("\x00\x01 torch bytes \xff", 16));
  EXPECT_EQ(store.add("counter", 3), 8);
  EXPECT_TRUE(store.check({"from_torch", "counter"}));
  EXPECT_FALSE(store.check({"from_torch", "never"}));
  try {
    store.wait({"never"}, 0.3);
    ADD_FAILURE() << "waiting for a key nobody sets returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), ("rank 1: the c10d store at 127.0.0.1:" + std::to_string(port) +
                            " (MASTER_ADDR:MASTER_PORT): wait: run7/never not set within 0.3 s").c_str());
  }
  // The connection still serves after a cancelled wait.
  store.set("from_dlm", std::string("dlm says \x00 hi", 13));
  EXPECT_EQ(text(store.get("verdict")), "ok");
  store.set("dlm_done", "1");
  const auto r = wait_child(peer, err.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  fs::remove_all(dir);
}

TEST(TcpStore, AnUnreachableStoreIsOneLineNamingTheAddressAndTheRank) {
  const int port = closed_port();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    TcpStore store("127.0.0.1", port, "x/", 0.5, "rank 3");
    FAIL() << "connected to a closed port";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 3: the c10d store at 127.0.0.1:" + std::to_string(port) +
                                         " (MASTER_ADDR:MASTER_PORT) was not reachable within 0.5 s: Connection refused");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

}  // namespace
}  // namespace dlm::test
