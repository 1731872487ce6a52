// podium::data::BulkServer and BulkCall — the data plane's own path over TCP, between hosts
// (docs/data.md, "Across hosts: podium's TCP path").
//
// UCX emulates get and put over TCP in software: a request and a reply per segment, handlers
// on both sides' progress threads, and a listener that authenticates nothing. Between hosts
// without RDMA hardware, a buffer's owner instead serves its own buffers on one TCP port of
// its own: a reader sends a request naming the buffer, its capability token and the range,
// and the owner sends the bytes straight from the registered memory (a get) or receives
// them straight into it (a put). Each side makes one system call per direction per chunk of
// the socket's buffer, with no copy in user space: what a raw socket does.
//
// Wire format (all integers little-endian; docs/data.md has the table):
//   connection  the CH-8 challenge-response of the control plane (channel/auth.h), the
//               owner as listener: nothing else is read from a peer that did not prove the
//               job's secret
//   request     "PDBK" kind[1] 0[3] id[8] offset[8] length[8] token[32]     (64 bytes)
//               kind 1: get (the owner answers with the bytes), 2: put (length bytes follow)
//   reply       "PDBR" status[4] length[8]                                  (16 bytes)
//               status 0: ok, a get's length bytes follow; else the error, as
//               subsystem << 16 | code (a DataErrc), and length bytes of its message follow
//   One request at a time per connection; a reader opens several to one owner for
//   operations in parallel.
//
// Threads: BulkServer runs one thread (podium-tcp, `nice` steps below the process, DA-11)
// that drives every connection with epoll, non-blocking: a large get to one reader does not
// hold up another reader's small one for more than one socket buffer's worth. BulkCall runs
// on the thread that advances it, and may be advanced by one thread and then another (the
// caller first, then a worker: data_transfer.cc). BulkPool is thread-safe.
// Locks: BulkServer's mu_ (in-flight counts and their waiters) and BulkPool's mu_ are leaves;
// no callback runs under them.
// Invariants:
//   DA-45 The owner's TCP port serves only peers that proved the job's secret (CH-8), at most
//         kMaxUnauthenticated of them unproven at once (the oldest is closed for a new one),
//         each closed when it has not proved it within kAuthTimeout. Every request is checked
//         against the BufferTable (DA-7: live buffer, token, write permission) and its range
//         against the buffer's size before one byte moves; a refused request is answered with
//         the error (a refused put's bytes are read and discarded) and the connection serves
//         the next. A connection that moves no byte for Config::stall_timeout (kStallTimeout)
//         inside a request is closed; one idle between requests is kept however long.
//   DA-46 A request counts as in flight on its buffer from before its check until its last
//         byte moved or its connection closed; after_idle(id) runs its callback once none is:
//         a drop answered after it (data_owner.cc) leaves no request of this server touching
//         the memory, and a request checked after the drop is refused (DA-8).
//   DA-47 A BulkCall never waits past its deadline (its connection is closed then, which
//         cancels the request at the owner), checks `gone` (the runtime's knowledge that the
//         owner's proc ended, RD-2) at least every kPollSlice while it waits, and puts its
//         connection back in the pool only after a complete reply: a connection is reused
//         only between requests.
//   DA-50 A BulkCall polls its socket without sleeping for at most `spin` (in all, per call),
//         while it dials or waits for the first byte of the reply, before it sleeps in poll():
//         a reply that comes within it is taken without the wake-up of a sleeping thread (on
//         the 2-core VM a warm 4 KiB read across namespace hosts went from 60 to 50 us,
//         median). Once the reply's bytes flow it sleeps between them: they come at the
//         link's pace. PODIUM_RDMA_TCP_SPIN_US, default 100; 0: none.
//   DA-53 The server's thread polls its sockets without sleeping for Config::spin after each
//         event (a request, a chunk, a connection) while no request is in flight (between
//         requests: inside one the socket's pace rules, and a spin would take the CPU that
//         the network stack needs), then sleeps in epoll_wait: a reader's next
//         request within it is served without the wake-up of a sleeping thread (between
//         namespace hosts of the 2-core VM, 4 KiB reads one after the other went from 29 to
//         23-24 us each; the owner pays at most the spin in CPU per burst of requests).
//         PODIUM_RDMA_TCP_SERVER_SPIN_US, default 50; 0: none.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "podium/base/error.h"
#include "podium/base/unique_fd.h"
#include "podium/data/buffer_table.h"

namespace podium::data {

inline constexpr size_t kBulkRequestBytes = 64;
inline constexpr size_t kBulkReplyBytes = 16;
inline constexpr size_t kMaxUnauthenticated = 64;                      // DA-45
inline constexpr std::chrono::seconds kStallTimeout{60};              // DA-45
inline constexpr std::chrono::milliseconds kPollSlice{50};             // DA-47
inline constexpr size_t kTurnBytes = size_t{4} << 20;
inline constexpr size_t kMaxBulkMessage = 1024;  // an error reply's message, at most
inline constexpr std::chrono::microseconds kDefaultTcpSpin{100};       // DA-50
inline constexpr std::chrono::microseconds kDefaultServerSpin{50};     // DA-53

enum class BulkKind : uint8_t { kGet = 1, kPut = 2 };

struct BulkRequest {
  BulkKind kind = BulkKind::kGet;
  uint64_t id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string token;  // 32 hex digits (BufferTable's)
};
std::array<std::byte, kBulkRequestBytes> encode_request(const BulkRequest& r);
// Nothing when `bytes` is not a well-formed request (bad magic, kind, or token length).
std::optional<BulkRequest> decode_request(const std::byte* bytes);

class BulkServer {
 public:
  struct Config {
    std::string host;    // the address to listen on (the control plane's host address)
    std::string secret;  // the job's secret (CH-8); empty: the job runs insecure (SE-2)
    int nice = 0;        // the thread's nice steps below the process (DA-11)
    // DA-45: a connection inside a request that moves no byte for this long is closed.
    std::chrono::milliseconds stall_timeout = kStallTimeout;
    // Bytes one connection moves per turn of the loop before the others get theirs.
    size_t turn_bytes = kTurnBytes;
    // DA-53: how long the thread polls for the next event without sleeping after one came;
    // negative: default_spin().
    std::chrono::microseconds spin{-1};
  };
  // DA-53: PODIUM_RDMA_TCP_SERVER_SPIN_US, else kDefaultServerSpin.
  static std::chrono::microseconds default_spin();
  // Listens on `host`, port 0, and starts the thread.
  [[nodiscard]] static Result<std::unique_ptr<BulkServer>> start(Config config,
                                                                  BufferTable& table);
  ~BulkServer();  // stop()
  BulkServer(const BulkServer&) = delete;
  BulkServer& operator=(const BulkServer&) = delete;

  // "HOST:PORT", what readers dial.
  const std::string& address() const { return address_; }
  // DA-46: runs `then` (on this server's thread, or here when idle already) once no request
  // on buffer `id` is in flight.
  void after_idle(uint64_t id, std::function<void()> then);
  struct Stats {
    uint64_t accepted = 0;       // connections accepted
    uint64_t authenticated = 0;  // of them, proved the secret
    uint64_t refused_auth = 0;   // closed for a wrong proof, a timeout or the cap (DA-45)
    uint64_t requests = 0;       // requests answered (ok or refused)
    uint64_t refused = 0;        // of them, refused (DA-45)
    uint64_t bytes = 0;          // bytes of buffers sent or received
    uint64_t connections = 0;    // open now
  };
  Stats stats() const;
  // Closes every connection and joins the thread. Idempotent.
  void stop();

  struct Impl;

 private:
  explicit BulkServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// Idle authenticated connections to owners, by "HOST:PORT" (DA-47).
class BulkPool {
 public:
  // `spin`: DA-50's, for the calls through this pool.
  explicit BulkPool(std::string secret,
                    std::chrono::steady_clock::duration spin = default_spin())
      : secret_(std::move(secret)), spin_(spin) {}
  const std::string& secret() const { return secret_; }
  std::chrono::steady_clock::duration spin() const { return spin_; }
  // DA-50: PODIUM_RDMA_TCP_SPIN_US, else kDefaultTcpSpin.
  static std::chrono::steady_clock::duration default_spin();
  // An idle connection to `address`, if one is kept and its owner has not closed it.
  UniqueFd take(const std::string& address);
  // Keeps `fd` (after a complete reply) for the next request to `address`. At most once a
  // second, it also closes kept connections whose owner closed them (an owner that ended):
  // a job that outlives many owners keeps no descriptor for the dead ones.
  void give(const std::string& address, UniqueFd fd);
  size_t idle() const;
  // In a child just forked: forgets the kept connections (closing this process's copies
  // only), which the parent still uses: two processes on one connection would mix their
  // requests. Called only where no other thread runs (a fork's child handler).
  void forget_after_fork();

 private:
  static constexpr size_t kKeptPerAddress = 8;
  std::string secret_;
  std::chrono::steady_clock::duration spin_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::vector<UniqueFd>> idle_;  // guarded by mu_
  std::chrono::steady_clock::time_point pruned_{};                 // guarded by mu_
};

// One request from this process to an owner's BulkServer: advanced by whoever holds it
// until it finished (DA-47).
class BulkCall {
 public:
  using Gone = std::function<std::optional<Error>()>;
  // `local`: where a get's bytes go, or a put's come from (request.length bytes).
  BulkCall(BulkPool& pool, std::string address, BulkRequest request, std::byte* local,
           std::chrono::steady_clock::time_point deadline, Gone gone);
  ~BulkCall();
  BulkCall(const BulkCall&) = delete;
  BulkCall& operator=(const BulkCall&) = delete;

  // Works on the request until it finished (true) or `until` passed (false: advance again).
  bool advance(std::chrono::steady_clock::time_point until);
  // Once advance() returned true: how it ended.
  const Status& status() const { return status_; }
  const std::string& address() const { return address_; }

 private:
  enum class Phase { kDial, kSend, kReply, kMessage, kData, kDone };
  bool fail(Error e);
  bool fail_io(std::string_view what, int err);
  // Waits (poll) for `events` on the connection until `until` or the deadline, in slices
  // of kPollSlice with `gone` asked between: false when the call ended (failed) or `until`
  // passed (`*late` set).
  bool wait(short events, std::chrono::steady_clock::time_point until, bool* late);
  bool dial(std::chrono::steady_clock::time_point until, bool* late);

  BulkPool& pool_;
  std::string address_;
  BulkRequest request_;
  std::byte* local_;
  std::chrono::steady_clock::time_point deadline_;
  Gone gone_;
  Phase phase_ = Phase::kDial;
  UniqueFd fd_;
  std::array<std::byte, kBulkRequestBytes> head_{};
  std::array<std::byte, kBulkReplyBytes> reply_{};
  size_t done_ = 0;      // bytes of the current phase moved
  uint64_t length_ = 0;  // the reply's length
  uint32_t code_ = 0;    // the reply's status
  std::string message_;
  Status status_;
  std::chrono::steady_clock::duration spun_{};  // DA-50: of pool_.spin()
  bool waited_ = false;  // the first wait for the reply was made
};

}  // namespace podium::data
