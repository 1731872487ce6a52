// Engine tests: the registration cache, and transfers between two processes (a forked child
// and the test), whose worker addresses and rkeys travel over a socketpair, as podium's
// control plane carries them between procs. Parameterized over the paths: UCX's default
// choice on one host (its shared-memory transports, NONE error mode: DA-9), TCP alone
// (UCX_TLS=tcp, the cross-host path) and podium's own CMA copies (ops that carry the pid: DA-10).
#include "podium/data/engine.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "podium/data/checksum.h"
#include "podium/data/test_pipe.h"

namespace podium::data {
namespace {

using namespace std::chrono_literals;

using testing::read_all;
using testing::write_all;

bool send_str(int fd, const std::string& s) {
  uint64_t n = s.size();
  return write_all(fd, &n, sizeof n) && write_all(fd, s.data(), s.size());
}

bool recv_str(int fd, std::string& s) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof n) || n > (1u << 20)) return false;
  s.resize(n);
  return read_all(fd, s.data(), n);
}

// What the child publishes: its worker address, and two registered regions (one to read
// from, one to write into).
struct Published {
  std::string address;
  uint64_t src_addr = 0;
  std::string src_rkey;
  uint64_t dst_addr = 0;
  std::string dst_rkey;
};

constexpr size_t kBytes = size_t{24} << 20;  // several chunks of 4 MiB (DA-3)

uint8_t pattern(size_t i, uint8_t salt) { return static_cast<uint8_t>((i * 131 + salt) & 0xff); }

// The child: registers two regions, publishes them, then waits for the parent's word; on 'c'
// it checks the region the parent wrote and answers 'y' or 'n'. Never returns.
[[noreturn]] void child_main(int fd) {
  auto engine = Engine::make({});
  if (!engine) _exit(10);
  std::vector<uint8_t> src(kBytes), dst(kBytes, 0);
  for (size_t i = 0; i < kBytes; ++i) src[i] = pattern(i, 7);
  auto rs = (*engine)->register_memory(src.data(), src.size(), nullptr);
  auto rd = (*engine)->register_memory(dst.data(), dst.size(), nullptr);
  if (!rs || !rd) _exit(11);
  uint64_t a = (*rs)->addr(), b = (*rd)->addr();
  if (!send_str(fd, (*engine)->address()) || !write_all(fd, &a, 8) ||
      !send_str(fd, (*rs)->rkey()) || !write_all(fd, &b, 8) || !send_str(fd, (*rd)->rkey())) {
    _exit(12);
  }
  char cmd = 0;
  while (read_all(fd, &cmd, 1)) {
    if (cmd == 'c') {
      bool ok = true;
      for (size_t i = 0; i < kBytes && ok; ++i) ok = dst[i] == pattern(i, 9);
      char answer = ok ? 'y' : 'n';
      if (!write_all(fd, &answer, 1)) break;
    }
  }
  _exit(0);
}

// The child runs child_main in a fresh image of this binary (fork, then exec): a process
// forked from one whose UCX already runs inherits UCX's state without its threads, and UCX's
// TCP transport then never answers there (seen with UCX 1.22). podium's procs start from an
// image that has not touched UCX (DA-1), as this child does.
constexpr const char* kChildFdEnv = "PODIUM_DATA_TEST_CHILD_FD";
[[maybe_unused]] const bool kIsChild = [] {
  if (const char* fd = std::getenv(kChildFdEnv)) child_main(std::atoi(fd));
  return false;
}();

class EngineTransfer : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    cma_ = std::string(GetParam()) == "cma";
    if (cma_ && !Engine::cma_allowed()) GTEST_SKIP() << "the kernel refuses process_vm_readv here";
    if (*GetParam() && !cma_) {
      ::setenv("UCX_TLS", GetParam(), 1);
    } else {
      ::unsetenv("UCX_TLS");
    }
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      ::close(sv[0]);
      int fd = ::dup(sv[1]);  // without CLOEXEC: it survives the exec
      ::setenv(kChildFdEnv, std::to_string(fd).c_str(), 1);
      ::execl("/proc/self/exe", "data_test_child", static_cast<char*>(nullptr));
      _exit(13);
    }
    ::close(sv[1]);
    fd_ = sv[0];
    ASSERT_TRUE(recv_str(fd_, pub_.address));
    ASSERT_TRUE(read_all(fd_, &pub_.src_addr, 8));
    ASSERT_TRUE(recv_str(fd_, pub_.src_rkey));
    ASSERT_TRUE(read_all(fd_, &pub_.dst_addr, 8));
    ASSERT_TRUE(recv_str(fd_, pub_.dst_rkey));
    auto e = Engine::make({});
    ASSERT_TRUE(e) << e.error().message;
    engine_ = std::move(*e);
  }

  void TearDown() override {
    if (engine_) engine_->stop();
    if (fd_ >= 0) ::close(fd_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    ::unsetenv("UCX_TLS");
  }

  Op get_op(std::vector<uint8_t>& into) {
    return Op{Op::Kind::kGet, pub_.address, pub_.src_addr, pub_.src_rkey,
              reinterpret_cast<std::byte*>(into.data()), into.size(), nullptr, true,
              cma_ ? pid_ : 0};
  }

  // An engine of its own with `copiers` copiers (DA-11).
  static std::unique_ptr<Engine> engine_with(size_t copiers) {
    EngineConfig config;
    config.copiers = copiers;
    auto e = Engine::make(config);
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
  }
  // Replaces this test's engine with one of `copiers` copiers.
  void use_copiers(size_t copiers) {
    auto e = engine_with(copiers);
    ASSERT_TRUE(e);
    engine_->stop();
    engine_ = std::move(e);
  }

  bool cma_ = false;  // DA-10: ops carry the child's pid

  pid_t pid_ = -1;
  int fd_ = -1;
  Published pub_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(EngineTransfer, GetReadsTheChildsRegionInChunks) {  // DA-3, DA-10
  std::vector<uint8_t> into(kBytes, 0);
  auto f = engine_->submit({get_op(into)}, 30s);
  auto r = f.get(60s);
  ASSERT_TRUE(r) << r.error().message;
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(into[i], pattern(i, 7)) << "byte " << i;
  auto st = engine_->stats();
  EXPECT_GE(st.chunks, kBytes / kDefaultChunkBytes);
  EXPECT_EQ(st.bytes, kBytes);
}

TEST_P(EngineTransfer, AnOpOnCudaMemoryNeverGoesThroughCma) {  // DA-23
  // The op names a pid that CMA could not copy from (a reaped child's): marked as reaching
  // CUDA memory, it must go through UCX, whatever the path of the suite, and arrive.
  pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(gone, &status, 0), gone);
  std::vector<uint8_t> into(kBytes, 0);
  Op op = get_op(into);
  op.peer_pid = gone;
  op.remote_memory = Memory::kCuda;  // what the reader is told of the owner's region
  auto r = engine_->submit({op}, 30s).get(60s);
  ASSERT_TRUE(r) << r.error().message;
  for (size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(into[i], pattern(i, 7)) << "byte " << i;
}

TEST_P(EngineTransfer, PutIsAtThePeerWhenItCompletes) {  // DA-4
  std::vector<uint8_t> from(kBytes);
  for (size_t i = 0; i < kBytes; ++i) from[i] = pattern(i, 9);
  Op put{Op::Kind::kPut, pub_.address, pub_.dst_addr, pub_.dst_rkey,
         reinterpret_cast<std::byte*>(from.data()), from.size(), nullptr, true,
         cma_ ? pid_ : 0};
  auto r = engine_->submit({put}, 30s).get(60s);
  ASSERT_TRUE(r) << r.error().message;
  char cmd = 'c', answer = 0;
  ASSERT_TRUE(write_all(fd_, &cmd, 1));
  ASSERT_TRUE(read_all(fd_, &answer, 1));
  EXPECT_EQ(answer, 'y');
}

TEST_P(EngineTransfer, SeveralOpsRunAsOneTransfer) {
  std::vector<uint8_t> a(4096), b(kBytes / 2);
  Op first = get_op(a), second = get_op(b);
  second.remote_addr += 100;
  auto r = engine_->submit({first, second}, 30s).get(60s);
  ASSERT_TRUE(r) << r.error().message;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], pattern(i, 7));
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], pattern(i + 100, 7));
}

TEST_P(EngineTransfer, AStoppedPeerTimesOutAndTheTransferIsCancelled) {  // DA-5
  std::vector<uint8_t> warm(16);
  ASSERT_TRUE(engine_->submit({get_op(warm)}, 30s).get(60s));
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  // TCP: UCX emulates get with messages the stopped peer never answers. Shared memory and
  // CMA may finish without the peer; then there is nothing to time out.
  std::vector<uint8_t> into(kBytes);
  auto r = engine_->submit({get_op(into)}, 200ms).get(60s);
  ::kill(pid_, SIGCONT);
  if (std::string(GetParam()) == "tcp") {
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().is(DataErrc::kTimeout)) << r.error().message;
    EXPECT_NE(r.error().message.find("did not finish within 200 ms"), std::string::npos);
    EXPECT_EQ(engine_->stats().timeouts, 1u);
  }
  // Whatever was in flight is finished or cancelled: nothing stays active.
  for (int i = 0; i < 500 && engine_->stats().active != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(engine_->stats().active, 0u);
}

TEST_P(EngineTransfer, NoTimeLeftPostsNothing) {  // DA-5
  std::vector<uint8_t> into(kBytes, 0);
  auto r = engine_->submit({get_op(into)}, std::chrono::nanoseconds(0)).get(60s);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(DataErrc::kTimeout));
  EXPECT_EQ(engine_->stats().chunks, 0u);
  EXPECT_EQ(into[1], 0);
}

TEST_P(EngineTransfer, ADeadPeerFailsTheTransfer) {  // DA-6, DA-9
  std::vector<uint8_t> warm(16);
  ASSERT_TRUE(engine_->submit({get_op(warm)}, 30s).get(60s));
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  std::vector<uint8_t> into(kBytes);
  auto r = engine_->submit({get_op(into)}, 5s).get(60s);
  ASSERT_FALSE(r);
  if (std::string(GetParam()) == "tcp") {
    EXPECT_TRUE(r.error().is(DataErrc::kTransferFailed)) << r.error().message;  // DA-6
  } else if (cma_) {
    EXPECT_TRUE(r.error().is(DataErrc::kTransferFailed)) << r.error().message;  // DA-10
    EXPECT_NE(r.error().message.find("ended"), std::string::npos) << r.error().message;
  } else {
    // DA-9: on one host UCX reports a dead peer when its transport notices (CMA), else the
    // timeout ends the transfer; podium's control plane is what reports the death.
    EXPECT_TRUE(r.error().is(DataErrc::kTransferFailed) || r.error().is(DataErrc::kTimeout))
        << r.error().message;
  }
}

TEST_P(EngineTransfer, CmaChunksAreSharedByTheCopiers) {  // DA-11
  if (!cma_) GTEST_SKIP() << "copiers copy CMA chunks only";
  // Two copiers: 1 MiB is cut in two, so both copy one transfer.
  ASSERT_NO_FATAL_FAILURE(use_copiers(2));
  EXPECT_EQ(engine_->stats().copiers, 2u);
  std::vector<uint8_t> into(1 << 20, 0);
  auto r = engine_->submit({get_op(into)}, 30s).get(60s);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(engine_->stats().chunks, 2u);
  for (size_t i = 0; i < into.size(); ++i) ASSERT_EQ(into[i], pattern(i, 7)) << "byte " << i;
  // A large transfer and a small one at once: both complete, chunks round robin.
  std::vector<uint8_t> big(kBytes, 0), small(4096, 0);
  auto fb = engine_->submit({get_op(big)}, 30s);
  auto fs = engine_->submit({get_op(small)}, 30s);
  ASSERT_TRUE(fs.get(60s));
  ASSERT_TRUE(fb.get(60s));
  for (size_t i = 0; i < small.size(); ++i) ASSERT_EQ(small[i], pattern(i, 7));
  for (size_t i = 0; i < big.size(); i += 4093) ASSERT_EQ(big[i], pattern(i, 7));
  // One copier: one chunk up to the chunk size.
  auto e1 = engine_with(1);
  ASSERT_TRUE(e1);
  std::fill(into.begin(), into.end(), 0);
  ASSERT_TRUE(e1->submit({get_op(into)}, 30s).get(60s));
  EXPECT_EQ(e1->stats().chunks, 1u);
  EXPECT_EQ(into[12345], pattern(12345, 7));
  e1->stop();
}

TEST_P(EngineTransfer, ACallerCopyIsSharedWithTheCopiers) {  // DA-37, DA-31
  if (!cma_) GTEST_SKIP() << "only same-host CMA operations are copied by their caller";
  ASSERT_NO_FATAL_FAILURE(use_copiers(2));
  // 1 MiB: two chunks of 512 KiB, the caller takes them with the copiers (not one whole job).
  std::vector<uint8_t> into(1 << 20, 0);
  auto before = engine_->stats();
  auto r = engine_->submit({get_op(into)}, 30s, /*caller_copies=*/true).get(60s);
  ASSERT_TRUE(r) << r.error().message;
  auto after = engine_->stats();
  EXPECT_EQ(after.caller_copied - before.caller_copied, 1u);
  EXPECT_EQ(after.chunks - before.chunks, 2u);
  for (size_t i = 0; i < into.size(); ++i) ASSERT_EQ(into[i], pattern(i, 7)) << "byte " << i;
  // Below 2 * kMinCmaChunk the caller copies it whole (DA-31): one job.
  std::vector<uint8_t> small(kMinCmaChunk, 0);
  before = engine_->stats();
  ASSERT_TRUE(engine_->submit({get_op(small)}, 30s, true).get(60s));
  after = engine_->stats();
  EXPECT_EQ(after.chunks - before.chunks, 1u);
  EXPECT_EQ(small[777], pattern(777, 7));
  // Many at once from two callers: every byte arrives, every future completes.
  std::vector<std::vector<uint8_t>> dst(8, std::vector<uint8_t>((1 << 20) + 4096, 0));
  std::vector<actor::Future<void>> futs;
  std::thread other([&] {
    for (size_t k = 4; k < 8; ++k)
      ASSERT_TRUE(engine_->submit({get_op(dst[k])}, 30s, true).get(60s));
  });
  for (size_t k = 0; k < 4; ++k) futs.push_back(engine_->submit({get_op(dst[k])}, 30s, true));
  for (auto& f : futs) ASSERT_TRUE(f.get(60s));
  other.join();
  for (auto& d : dst)
    for (size_t i = 0; i < d.size(); i += 1021) ASSERT_EQ(d[i], pattern(i, 7)) << "byte " << i;
  // One copier: the caller copies it whole (DA-31).
  auto e1 = engine_with(1);
  ASSERT_TRUE(e1);
  std::fill(into.begin(), into.end(), 0);
  before = e1->stats();
  ASSERT_TRUE(e1->submit({get_op(into)}, 30s, true).get(60s));
  EXPECT_EQ(e1->stats().chunks - before.chunks, 1u);
  EXPECT_EQ(into[54321], pattern(54321, 7));
  e1->stop();
}

TEST_P(EngineTransfer, ASummedGetIsSummedByTheChunksThatCopyIt) {  // DA-44, DA-40
  for (size_t copiers : {size_t{1}, size_t{2}}) {
    auto e = engine_with(copiers);
    ASSERT_TRUE(e);
    std::vector<uint8_t> into(kBytes + 3, 0);  // several chunks, and a last partial word
    Op op = get_op(into);
    op.size = kBytes;
    op.sum = std::make_shared<CopySum>();
    ASSERT_TRUE(e->submit({op}, 30s).get(60s));
    for (size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(into[i], pattern(i, 7)) << "byte " << i;
    if (cma_) {  // the engine's own copies summed it
      EXPECT_TRUE(op.sum->taken);
      EXPECT_EQ(op.sum->value.load(), word_sum(into.data(), kBytes)) << copiers << " copier(s)";
    } else {  // through UCX: left to the caller
      EXPECT_FALSE(op.sum->taken);
    }
    e->stop();
  }
}

TEST_P(EngineTransfer, CopyNowCopiesHereOnlyWhatItsCallerMayCopyWhole) {  // DA-43, DA-31
  std::vector<uint8_t> into(64 << 10, 0);
  if (!cma_) {  // an operation through UCX is never copied here
    EXPECT_FALSE(engine_->copy_now(get_op(into)));
    return;
  }
  auto one = engine_with(1);
  ASSERT_TRUE(one);
  auto before = one->stats();
  uint64_t sum = 0;
  auto done = one->copy_now(get_op(into), &sum);
  ASSERT_TRUE(done);
  EXPECT_EQ(*done, 0);
  for (size_t i = 0; i < into.size(); ++i) ASSERT_EQ(into[i], pattern(i, 7)) << "byte " << i;
  EXPECT_EQ(sum, word_sum(into.data(), into.size()));
  auto after = one->stats();
  EXPECT_EQ(after.transfers - before.transfers, 1u);  // counted as one caller-copied transfer
  EXPECT_EQ(after.caller_copied - before.caller_copied, 1u);
  EXPECT_EQ(after.bytes - before.bytes, into.size());
  EXPECT_EQ(after.active, 0u);  // no transfer entry was made
  // What a caller may not copy whole (DA-31: 4 times its bytes through CMA over 4 MiB), and
  // CUDA memory, are left to submit().
  std::vector<uint8_t> big(2 << 20, 0);
  EXPECT_FALSE(one->copy_now(get_op(big)));
  Op cuda = get_op(into);
  cuda.local_memory = Memory::kCuda;
  EXPECT_FALSE(one->copy_now(cuda));
  EXPECT_EQ(one->stats().transfers, after.transfers);
  // With two copiers, an operation DA-37 shares with them is left to submit() too.
  auto two = engine_with(2);
  ASSERT_TRUE(two);
  std::vector<uint8_t> mib(1 << 20, 0), quarter(kMinCmaChunk, 0);
  EXPECT_FALSE(two->copy_now(get_op(mib)));
  auto q = two->copy_now(get_op(quarter));
  ASSERT_TRUE(q);
  EXPECT_EQ(*q, 0);
  EXPECT_EQ(quarter[4321], pattern(4321, 7));
  two->stop();
  // A dead peer: the copy's errno, and nothing counted (its caller submits it, which says so).
  Op to_dead = get_op(into);
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  before = one->stats();
  auto dead = one->copy_now(to_dead);
  ASSERT_TRUE(dead);
  EXPECT_EQ(*dead, ESRCH);
  EXPECT_EQ(one->stats().transfers, before.transfers);
  one->stop();
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineTransfer, ::testing::Values("", "tcp", "cma"),
                         [](const auto& info) {
                           return std::string(*info.param ? info.param : "default");
                         });

TEST(EngineRegistration, OneRegistrationPerRegionReleasedWithItsLastHolder) {  // DA-2
  auto e = Engine::make({});
  ASSERT_TRUE(e) << e.error().message;
  auto& engine = **e;
  std::vector<uint8_t> a(1 << 20), b(4096);
  {
    auto r1 = engine.register_memory(a.data(), a.size(), nullptr);
    auto r2 = engine.register_memory(a.data(), a.size(), nullptr);
    ASSERT_TRUE(r1 && r2);
    EXPECT_EQ(r1->get(), r2->get());
    EXPECT_EQ(engine.registration_count(), 1u);
    auto r3 = engine.register_memory(b.data(), b.size(), nullptr);
    ASSERT_TRUE(r3);
    EXPECT_NE(r3->get(), r1->get());
    EXPECT_FALSE((*r3)->rkey().empty());
    EXPECT_EQ(engine.registration_count(), 2u);
  }
  EXPECT_EQ(engine.registration_count(), 0u);
  for (int i = 0; i < 2000; ++i) {
    auto r = engine.register_memory(a.data() + (i % 7), 1024, nullptr);
    ASSERT_TRUE(r);
  }
  EXPECT_EQ(engine.registration_count(), 0u);
  EXPECT_FALSE(engine.register_memory(a.data(), 0, nullptr));
}

TEST(EngineMemory, CudaMemoryIsRefusedWithoutCudaSupport) {  // DA-23
  auto e = Engine::make({});
  ASSERT_TRUE(e) << e.error().message;
  auto& engine = **e;
  EXPECT_TRUE(engine.supports(Memory::kHost));
  if (engine.supports(Memory::kCuda)) {
    GTEST_SKIP() << "this UCX has CUDA support: tests/python/test_rdma_cuda.py moves CUDA memory";
  }
  std::vector<uint8_t> a(4096);
  auto r = engine.register_memory(a.data(), a.size(), nullptr, Memory::kCuda);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(DataErrc::kUnavailable)) << r.error().to_string();
  EXPECT_NE(r.error().message.find("no CUDA support"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(Engine::ucx_version()), std::string::npos);
  EXPECT_EQ(engine.registration_count(), 0u);
}

TEST(EngineRegistration, KeepHoldsTheMemoryWhileRegistered) {  // DA-2
  auto e = Engine::make({});
  ASSERT_TRUE(e);
  auto mem = std::make_shared<std::vector<uint8_t>>(4096);
  std::weak_ptr<std::vector<uint8_t>> watch = mem;
  auto r = (*e)->register_memory(mem->data(), mem->size(), mem);
  ASSERT_TRUE(r);
  mem.reset();
  EXPECT_FALSE(watch.expired());
  r->reset();
  EXPECT_TRUE(watch.expired());
}

// The /proc stat fields of every podium-data thread of this process: fields[i] is field i
// (1-based, as proc(5) numbers them; the fields before the state are left empty).
std::vector<std::vector<std::string>> data_thread_stats() {
  std::vector<std::vector<std::string>> out;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    std::getline(f, line);
    size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (line.substr(open + 1, close - open - 1).rfind("podium-data", 0) != 0) continue;
    std::istringstream rest(line.substr(close + 2));  // field 3 (state) onwards
    std::vector<std::string> fields(3);
    for (std::string field; rest >> field;) fields.push_back(field);
    out.push_back(std::move(fields));
  }
  ::closedir(d);
  return out;
}

// The nice of every podium-data thread of this process.
std::vector<int> data_thread_nices() {
  std::vector<int> out;
  for (const auto& f : data_thread_stats()) {
    if (f.size() > 19) out.push_back(std::stoi(f[19]));
  }
  return out;
}

TEST(EngineThreads, DataThreadsRunBelowTheProcessPriority) {  // DA-11
  int base = ::getpriority(PRIO_PROCESS, 0);
  int want = std::min(19, base + kDefaultNice);
  EngineConfig two;
  two.copiers = 2;
  auto e = Engine::make(two);
  ASSERT_TRUE(e) << e.error().message;
  // The progress thread and one copier; each lowers its own priority when it starts.
  std::vector<int> nices;
  for (int i = 0; i < 200; ++i) {
    nices = data_thread_nices();
    size_t low = 0;
    for (int n : nices) low += n == want ? 1 : 0;
    if (nices.size() >= 2 && low == nices.size()) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(nices.size(), 2u);
  for (int n : nices) EXPECT_EQ(n, want);
  (*e)->stop();
  EXPECT_TRUE(data_thread_nices().empty());
}

TEST(EngineThreads, DefaultCopiersTakeAtMostHalfTheCpus) {  // DA-11
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  size_t cpus = CPU_COUNT(&set);
  EXPECT_EQ(Engine::default_copiers(), cpus >= 4 ? 2u : 1u);
  auto e = Engine::make({});
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ((*e)->stats().copiers, Engine::default_copiers());
  (*e)->stop();
}

// DA-51: without_tcp leaves UCX's tcp transport out, so the engine listens on no TCP port,
// unless UCX_TLS in the environment chooses; a UCX with CUDA support keeps it.
std::vector<std::string> tcp_listeners_of_this_process() {
  // The inodes of this process's sockets, then the listening ones among /proc/net/tcp{,6}.
  std::set<std::string> mine;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) mine.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, tr, retr, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (state == "0A" && mine.count(inode) != 0) out.push_back(local);  // 0A: LISTEN
    }
  }
  return out;
}

TEST(EngineTransports, WithoutTcpUcxOpensNoTcpListener) {  // DA-51
  if (std::getenv("UCX_TLS") != nullptr) GTEST_SKIP() << "UCX_TLS is set: it chooses";
  auto before = tcp_listeners_of_this_process();
  EngineConfig config;
  config.without_tcp = true;
  auto e = Engine::make(config);
  ASSERT_TRUE(e) << e.error().message;
  if ((*e)->supports(Memory::kCuda)) {
    EXPECT_TRUE((*e)->ucx_tcp());  // kept for GPU memory between hosts
  } else {
    EXPECT_FALSE((*e)->ucx_tcp());
    EXPECT_EQ(tcp_listeners_of_this_process(), before);
  }
  (*e)->stop();
  auto with = Engine::make({});
  ASSERT_TRUE(with) << with.error().message;
  EXPECT_TRUE((*with)->ucx_tcp());
  EXPECT_GT(tcp_listeners_of_this_process().size(), before.size());  // UCX's own port
  (*with)->stop();
  ::setenv("UCX_TLS", "tcp,self", 1);  // the environment wins over without_tcp
  auto chosen = Engine::make(config);
  ::unsetenv("UCX_TLS");
  ASSERT_TRUE(chosen) << chosen.error().message;
  EXPECT_TRUE((*chosen)->ucx_tcp());
  (*chosen)->stop();
}

TEST(EngineInstance, OneEnginePerProcess) {  // DA-1
  auto a = Engine::instance();
  auto b = Engine::instance();
  ASSERT_TRUE(a && b) << (a ? "" : a.error().message);
  EXPECT_EQ(*a, *b);
  EXPECT_FALSE((*a)->address().empty());
  EXPECT_FALSE(Engine::ucx_version().empty());
}

// DA-21, DA-22: an engine restricted to loopback reaches another such engine over TCP (PEER
// mode, as between hosts; 3 MiB in 1 MiB TCP segments), unless the environment names the
// devices.
// CPU ticks (utime + stime: fields 14 and 15) of every podium-data thread of this process.
long data_thread_ticks() {
  long ticks = 0;
  for (const auto& f : data_thread_stats()) {
    if (f.size() > 15) ticks += std::stol(f[14]) + std::stol(f[15]);
  }
  return ticks;
}

// A get of all of `reg` (of `owner`, an engine of this process) into `local`.
Op get_all(const Engine& owner, const Registration& reg, std::vector<uint8_t>& local) {
  Op op;
  op.kind = Op::Kind::kGet;
  op.peer = owner.address();
  op.remote_addr = reg.addr();
  op.rkey = reg.rkey();
  op.local = reinterpret_cast<std::byte*>(local.data());
  op.size = local.size();
  return op;
}

TEST(EngineThreads, AProgressThreadSpinsOnlyAfterActivityAndSleepsWhenIdle) {  // DA-34
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  if (std::getenv("PODIUM_RDMA_SPIN_US") == nullptr) {
    EXPECT_EQ(Engine::default_spin(), CPU_COUNT(&set) >= 4 ? kDefaultSpin : 0us);
  }
  EngineConfig spin;
  spin.spin = 5000us;
  spin.net_devices = "lo";
  auto owner = Engine::make(spin);
  auto reader = Engine::make(spin);
  ASSERT_TRUE(owner && reader);
  std::vector<uint8_t> remote(4096, 7), local(4096);
  auto reg = (*owner)->register_memory(remote.data(), remote.size(), nullptr);
  ASSERT_TRUE(reg) << reg.error().message;
  Op op = get_all(**owner, **reg, local);
  for (int i = 0; i < 50; ++i) {  // back to back: both progress threads stay awake
    auto done = (*reader)->submit({op}, 20s).get(60s);
    ASSERT_TRUE(done) << done.error().message;
  }
  EXPECT_EQ(local, remote);
  // Idle: after their spin, both threads sleep. Two threads spinning for the 500 ms below
  // would take about 100 ticks; sleeping ones take none.
  std::this_thread::sleep_for(100ms);
  long before = data_thread_ticks();
  std::this_thread::sleep_for(500ms);
  long used = data_thread_ticks() - before;
  EXPECT_LT(used, 20) << "podium-data threads kept the CPU while idle";
  (*reader)->stop();
  (*owner)->stop();
}

TEST(EngineNetDevices, RestrictedToLoopbackAndStillTransfers) {
  if (const char* env = std::getenv("UCX_NET_DEVICES"); env != nullptr && *env != '\0') {
    auto e = Engine::make({.net_devices = "lo"});
    ASSERT_TRUE(e) << e.error().message;
    EXPECT_EQ((*e)->net_devices(), env);  // the environment wins
    return;
  }
  auto owner = Engine::make({.net_devices = "lo"});
  auto reader = Engine::make({.net_devices = "lo"});
  ASSERT_TRUE(owner && reader) << (owner ? reader.error().message : owner.error().message);
  EXPECT_EQ((*owner)->net_devices(), "lo");
  EXPECT_TRUE(Engine::make({})->get()->net_devices().empty());
  std::vector<uint8_t> remote(3 << 20), local(remote.size());
  for (size_t i = 0; i < remote.size(); ++i) remote[i] = static_cast<uint8_t>(i * 7);
  auto reg = (*owner)->register_memory(remote.data(), remote.size(), nullptr);
  ASSERT_TRUE(reg) << reg.error().message;
  Op op = get_all(**owner, **reg, local);
  op.same_host = false;  // PEER mode: UCX's network transports, here loopback only
  auto done = (*reader)->submit({op}, 20s).get(60s);
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(local, remote);
}

}  // namespace
}  // namespace podium::data
