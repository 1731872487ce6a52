// Shared pages (DA-29, DA-32), windows on them (DA-30) and copies through them (DA-10).
#include "podium/data/shm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "podium/data/checksum.h"
#include "podium/data/cma.h"
#include "podium/data/engine.h"
#include "podium/data/shm_maps.h"
#include "podium/data/test_pipe.h"

namespace podium::data {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kRegion = (size_t{1} << 20) + 3 * kPage;  // several pages, and edges

uint8_t pattern(size_t i, uint8_t salt) { return static_cast<uint8_t>((i * 131 + salt) & 0xff); }

// A private anonymous mapping of `n` bytes, filled with pattern(salt).
std::byte* anon(size_t n, uint8_t salt) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* b = static_cast<std::byte*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(pattern(i, salt));
  return b;
}

// A shared mapping of `n` bytes of a temporary file, unlinked at once (MAP_FAILED if not).
void* file_mapping(size_t n) {
  char path[] = "/tmp/podium-shm-test-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) return MAP_FAILED;
  ::unlink(path);
  void* p = ::ftruncate(fd, static_cast<off_t>(n)) == 0
                ? ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  ::close(fd);  // the mapping keeps the file
  return p;
}

// The permissions and path of the mapping that holds `addr` in /proc/self/maps.
std::string mapping_of(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  auto a = reinterpret_cast<uint64_t>(addr);
  while (std::getline(maps, line)) {
    uint64_t lo = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    uint64_t hi = std::stoull(line.substr(line.find('-') + 1, line.find(' ')), nullptr, 16);
    if (lo <= a && a < hi) {
      std::string perms = line.substr(line.find(' ') + 1, 4);
      auto slash = line.find('/');
      return perms + (slash == std::string::npos ? "" : " " + line.substr(slash));
    }
  }
  return "";
}

using testing::read_all;
using testing::write_all;

TEST(SharedPages, AMoveKeepsEveryByteAndEveryAddressAndLeavesTheEdges) {  // DA-29
  std::byte* mem = anon(kRegion, 3);
  ASSERT_NE(mem, nullptr);
  const std::byte* region = mem + 100;  // not page-aligned: its first and last pages are edges
  size_t size = kRegion - 200;
  auto sp = shm::share_pages(region, size, kPage, nullptr);
  ASSERT_TRUE(sp) << sp.error().message;
  ASSERT_TRUE(*sp);
  const auto& ref = (*sp)->ref();
  EXPECT_EQ(ref.begin, reinterpret_cast<uint64_t>(mem) + kPage);
  EXPECT_EQ(ref.end, reinterpret_cast<uint64_t>(mem) + kRegion - kPage);
  for (size_t i = 0; i < kRegion; ++i) {
    ASSERT_EQ(static_cast<uint8_t>(mem[i]), pattern(i, 3)) << i;
  }
  EXPECT_EQ(mapping_of(mem + kPage).rfind("rw-s /memfd:podium-rdma", 0), 0u)
      << mapping_of(mem + kPage);
  EXPECT_EQ(mapping_of(mem), "rw-p");  // the edge page stays private
  // A window (here on this very process) sees the owner's writes, and the owner its writes.
  auto w = shm::open_window(::getpid(), ref);
  ASSERT_TRUE(w) << w.error().message;
  mem[kPage + 5] = std::byte{0xAB};
  EXPECT_EQ((*w)->at(ref.begin + 5)[0], std::byte{0xAB});
  (*w)->at(ref.begin + 9)[0] = std::byte{0xCD};
  EXPECT_EQ(mem[kPage + 9], std::byte{0xCD});
  EXPECT_TRUE((*w)->owner_alive());
  w->reset();
  sp->reset();
  shm::wait_given_back();
  ::munmap(mem, kRegion);
}

TEST(SharedPages, FilesReadOnlyMemoryAndSmallRunsAreLeftAsTheyAre) {  // DA-29
  void* file = file_mapping(kRegion);
  ASSERT_NE(file, MAP_FAILED);
  auto f = shm::share_pages(file, kRegion, kPage, nullptr);
  ASSERT_TRUE(f);
  EXPECT_FALSE(*f) << "a file mapping (np.memmap) must keep writing to its file";
  std::byte* mem = anon(kRegion, 1);
  ASSERT_EQ(::mprotect(mem, kRegion, PROT_READ), 0);
  auto ro = shm::share_pages(mem, kRegion, kPage, nullptr);
  ASSERT_TRUE(ro);
  EXPECT_FALSE(*ro) << "read-only memory";
  ASSERT_EQ(::mprotect(mem, kRegion, PROT_READ | PROT_WRITE), 0);
  auto small = shm::share_pages(mem, kRegion, kRegion + kPage, nullptr);  // fewer pages than that
  ASSERT_TRUE(small);
  EXPECT_FALSE(*small);
  EXPECT_EQ(mapping_of(mem), "rw-p");
  ::munmap(file, kRegion);
  ::munmap(mem, kRegion);
}

TEST(SharedPages, TheKernelsQueryAndItsTextDecideAlike) {  // DA-29
  auto b = [](const void* p) { return reinterpret_cast<uint64_t>(p); };
  if (!shm::detail::movable_by_query(b(&kPage), b(&kPage) + kPage, false)) {
    GTEST_SKIP() << "this kernel has no PROCMAP_QUERY (Linux 6.11): the text form decides alone";
  }
  std::byte* mem = anon(8 * kPage, 1);
  ASSERT_NE(mem, nullptr);
  void* file = file_mapping(kPage);
  ASSERT_NE(file, MAP_FAILED);
  ASSERT_EQ(::mprotect(mem + 6 * kPage, kPage, PROT_READ), 0);  // a read-only page inside
  ASSERT_EQ(::munmap(mem + 7 * kPage, kPage), 0);               // and a hole after it
  struct Case {
    const char* what;
    uint64_t begin, end;
    bool movable;
  } cases[] = {
      {"private anonymous memory", b(mem), b(mem + 6 * kPage), true},
      {"one page of it", b(mem + kPage), b(mem + 2 * kPage), true},
      {"up to a read-only page", b(mem), b(mem + 7 * kPage), false},
      {"into a hole", b(mem + 7 * kPage), b(mem + 8 * kPage), false},
      {"a file mapping", b(file), b(file) + kPage, false},
  };
  for (const auto& c : cases) {
    for (bool guard : {false, true}) {
      auto by_query = shm::detail::movable_by_query(c.begin, c.end, guard);
      EXPECT_EQ(shm::detail::movable_by_text(c.begin, c.end, guard), c.movable) << c.what;
      if (guard && !by_query) continue;  // /dev/shm on /dev's filesystem: the text decides
      ASSERT_TRUE(by_query.has_value()) << c.what;
      EXPECT_EQ(*by_query, c.movable) << c.what << (guard ? ", guarded" : "");
    }
  }
  ::munmap(file, kPage);
  ::munmap(mem, 7 * kPage);
}

TEST(SharedPages, NothingMovesInAProcessThatMapsAnRdmaDeviceUnlessForced) {  // DA-29
  // A driver's device node, as an RDMA library maps it; a file of that name stands for it (root).
  bool made_dir = ::mkdir("/dev/infiniband", 0755) == 0;
  char path[] = "/dev/infiniband/podium-shm-test-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) GTEST_SKIP() << "cannot make a file under /dev/infiniband (not root)";
  ASSERT_EQ(::ftruncate(fd, kPage), 0);
  void* dev = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(dev, MAP_FAILED);
  std::byte* mem = anon(kRegion, 8);
  ::unsetenv("PODIUM_RDMA_SHM");
  uint64_t page_in = (reinterpret_cast<uint64_t>(mem) + kPage - 1) & ~uint64_t{kPage - 1};
  EXPECT_FALSE(shm::detail::movable_by_text(page_in, page_in + kPage, true));
  if (auto q = shm::detail::movable_by_query(page_in, page_in + kPage, true)) {
    EXPECT_FALSE(*q);
  }
  auto guarded = shm::share_pages(mem, kRegion, kPage, nullptr);
  ::setenv("PODIUM_RDMA_SHM", "1", 1);
  auto forced = shm::share_pages(mem, kRegion, kPage, nullptr);
  ::unsetenv("PODIUM_RDMA_SHM");
  ::munmap(dev, kPage);
  ::unlink(path);
  if (made_dir) ::rmdir("/dev/infiniband");
  ASSERT_TRUE(guarded);
  EXPECT_FALSE(*guarded) << "a device that may pin user pages is mapped";
  ASSERT_TRUE(forced && *forced);
  forced->reset();
  shm::wait_given_back();
  ::munmap(mem, kRegion);
}

TEST(SharedPages, ARegionInsideLiveSharedPagesSharesThemAndOneAcrossTheirEndDoesNot) {  // DA-29
  std::byte* mem = anon(4 * kRegion, 2);
  ASSERT_NE(mem, nullptr);
  auto a = shm::share_pages(mem, 2 * kRegion, kPage, nullptr);
  ASSERT_TRUE(a && *a);
  auto inside = shm::share_pages(mem + kPage, kRegion, kPage, nullptr);
  ASSERT_TRUE(inside && *inside);
  EXPECT_EQ(inside->get(), a->get());
  auto across = shm::share_pages(mem + kRegion, 2 * kRegion, kPage, nullptr);
  ASSERT_TRUE(across);
  EXPECT_FALSE(*across);
  inside->reset();
  a->reset();
  shm::wait_given_back();
  ::munmap(mem, 4 * kRegion);
}

TEST(SharedPages, GivenBackPagesArePrivateKeepTheirBytesAndReadZerosOnceDropped) {  // DA-32
  std::byte* mem = anon(kRegion, 4);
  ASSERT_NE(mem, nullptr);
  auto keep = std::make_shared<int>(0);
  auto sp = shm::share_pages(mem, kRegion, kPage, keep);
  ASSERT_TRUE(sp && *sp);
  auto w = shm::open_window(::getpid(), (*sp)->ref());
  ASSERT_TRUE(w);
  (*w)->at(reinterpret_cast<uint64_t>(mem) + 7)[0] = std::byte{0x5A};  // a reader's write
  uint64_t before = shm::given_back_count();
  EXPECT_EQ(keep.use_count(), 2);
  sp->reset();
  shm::wait_given_back();
  EXPECT_EQ(shm::given_back_count(), before + 1);
  EXPECT_EQ(keep.use_count(), 1) << "the memory is let go once given back";
  EXPECT_EQ(mapping_of(mem).substr(0, 4), "rw-p");
  EXPECT_EQ(mem[7], std::byte{0x5A});
  for (size_t i = 8; i < kRegion; ++i) ASSERT_EQ(static_cast<uint8_t>(mem[i]), pattern(i, 4)) << i;
  // Private again: what the window (the memfd) holds is gone, a fork copies, and dropped
  // pages read zeros, as an allocator that reuses them with MADV_DONTNEED assumes.
  EXPECT_EQ((*w)->at(reinterpret_cast<uint64_t>(mem) + 7)[0], std::byte{0});
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    mem[9] = std::byte{0x77};
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(static_cast<uint8_t>(mem[9]), pattern(9, 4));
  ASSERT_EQ(::madvise(mem, kRegion, MADV_DONTNEED), 0);
  EXPECT_EQ(mem[7], std::byte{0});
  EXPECT_EQ(mem[kRegion - 1], std::byte{0});
  // Handed out again by an allocator, given-back pages can be shared again.
  mem[11] = std::byte{0x11};
  auto again = shm::share_pages(mem, kRegion, kPage, nullptr);
  ASSERT_TRUE(again && *again);
  EXPECT_EQ(mapping_of(mem).rfind("rw-s /memfd:podium-rdma", 0), 0u);
  EXPECT_EQ(mem[11], std::byte{0x11});
  again->reset();
  shm::wait_given_back();
  ::munmap(mem, kRegion);
}

// An owner in another process: it shares pages and publishes their WindowRef, then waits.
constexpr const char* kOwnerFdEnv = "PODIUM_SHM_TEST_OWNER_FD";
[[noreturn]] void owner_main(int fd) {
  std::byte* mem = anon(kRegion, 5);
  auto sp = shm::share_pages(mem + 10, kRegion - 20, kPage, nullptr);
  if (!sp || !*sp) _exit(11);
  auto ref = (*sp)->ref();
  uint64_t base = reinterpret_cast<uint64_t>(mem);
  if (!write_all(fd, &ref, sizeof ref) || !write_all(fd, &base, sizeof base)) _exit(12);
  char c = 0;
  while (read_all(fd, &c, 1)) {
  }
  _exit(0);
}
[[maybe_unused]] const bool kIsOwner = [] {
  if (const char* fd = std::getenv(kOwnerFdEnv)) owner_main(std::atoi(fd));
  return false;
}();

TEST(Window, CopiesGoThroughTheWindowAndTheEdgesThroughCmaAndFailOnceTheOwnerEnded) {  // DA-30
  if (!Engine::cma_allowed()) GTEST_SKIP() << "the kernel refuses process_vm_readv here";
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // a fresh image: this process has threads
    int fd = ::dup(sv[1]);
    ::setenv(kOwnerFdEnv, std::to_string(fd).c_str(), 1);
    ::execl("/proc/self/exe", "shm_test_owner", static_cast<char*>(nullptr));
    _exit(13);
  }
  ::close(sv[1]);
  shm::WindowRef ref;
  uint64_t base = 0;
  ASSERT_TRUE(read_all(sv[0], &ref, sizeof ref));
  ASSERT_TRUE(read_all(sv[0], &base, sizeof base));

  auto wrong = ref;
  wrong.ino += 1;
  auto refused = shm::open_window(pid, wrong);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("not the buffer's shared pages"), std::string::npos)
      << refused.error().message;

  auto w = shm::open_window(pid, ref);
  ASSERT_TRUE(w) << w.error().message;
  std::vector<std::byte> into(kRegion - 20);
  Op op;
  op.kind = Op::Kind::kGet;
  op.remote_addr = base + 10;
  op.local = into.data();
  op.size = into.size();
  op.same_host = true;
  op.peer_pid = pid;
  op.window = *w;
  uint64_t through = 0;
  ASSERT_EQ(cma::copy(op, 0, op.size, &through), 0);
  EXPECT_EQ(through, ref.end - ref.begin);
  for (size_t i = 0; i < into.size(); ++i) {
    ASSERT_EQ(static_cast<uint8_t>(into[i]), pattern(i + 10, 5)) << i;
  }
  // Summed (DA-43): the edges' and the window's parts add up to the region's word sum, the
  // region starting at every offset within a word (the window's part summed as it is copied
  // where its words are 8-aligned).
  for (size_t shift = 0; shift < 8; ++shift) {
    std::vector<std::byte> summed(op.size + 8);
    Op s = op;
    s.local = summed.data() + shift;
    uint64_t total = 0;
    ASSERT_EQ(cma::copy(s, 0, s.size, nullptr, &total), 0);
    EXPECT_EQ(std::memcmp(s.local, into.data(), into.size()), 0);
    EXPECT_EQ(total, word_sum(into.data(), into.size())) << shift;
  }
  // A write: the edges (one system call for both) and the pages between them land, and read
  // back the same without the window, through CMA alone.
  std::vector<std::byte> from(into.size());
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<std::byte>(pattern(i, 9));
  Op put = op;
  put.kind = Op::Kind::kPut;
  put.local = from.data();
  ASSERT_EQ(cma::copy(put, 0, put.size, &through), 0);
  Op back = op;
  back.window = nullptr;
  std::vector<std::byte> again(into.size());
  back.local = again.data();
  ASSERT_EQ(cma::copy(back, 0, back.size), 0);
  EXPECT_EQ(std::memcmp(again.data(), from.data(), from.size()), 0);
  ::close(sv[0]);  // the owner exits
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_FALSE((*w)->owner_alive());
  EXPECT_EQ(cma::copy(op, 2 * kPage, 4 * kPage, &through), ESRCH)
      << "a copy through the window of an ended owner fails, as CMA's does";
}

TEST(Cma, StreamCopyCopiesEveryByteAtEveryAlignmentAndTouchesNothingElse) {  // DA-36
  std::vector<std::byte> src(4096 + 256), dst(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{64},
                   size_t{65}, size_t{1000}, size_t{4096}}) {
    for (size_t so = 0; so < 64; so += 7) {
      for (size_t d_off = 0; d_off < 64; d_off += 5) {
        std::fill(dst.begin(), dst.end(), std::byte{0xEE});
        cma::stream_copy(dst.data() + d_off, src.data() + so, n);
        ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + so, n), 0) << n << " " << so;
        for (size_t i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], std::byte{0xEE}) << "before";
        for (size_t i = d_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], std::byte{0xEE});
      }
    }
  }
}

TEST(Cma, CachedCopyCopiesEveryByteAtEveryAlignmentAndTouchesNothingElse) {  // DA-30
  // From 64 KiB, a source and destination not aligned alike take the loop of aligned stores.
  constexpr size_t kMax = (size_t{64} << 10) + 200;
  std::vector<std::byte> src(kMax + 128), dst(kMax + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  for (size_t n : {size_t{0}, size_t{100}, size_t{64} << 10, (size_t{64} << 10) + 1, kMax}) {
    for (size_t so = 0; so < 64; so += 13) {
      for (size_t d_off = 0; d_off < 64; d_off += 11) {
        std::fill(dst.begin(), dst.end(), std::byte{0xEE});
        cma::cached_copy(dst.data() + d_off, src.data() + so, n);
        ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + so, n), 0) << n << " " << so;
        for (size_t i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], std::byte{0xEE}) << "before";
        for (size_t i = d_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], std::byte{0xEE});
      }
    }
  }
}

TEST(Cma, CopiesThatSumCopyAndSumAtEveryAlignment) {  // DA-40, DA-43, DA-44
  // From 64 KiB, where the region's words fall on 8-byte boundaries, summed as copied.
  constexpr size_t kMax = (size_t{64} << 10) + 200;
  std::vector<std::byte> src(kMax + 128), dst(kMax + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  for (size_t n : {size_t{0}, size_t{100}, size_t{64} << 10, (size_t{64} << 10) + 1, kMax}) {
    for (size_t so = 0; so < 64; so += 13) {
      for (size_t d_off = 0; d_off < 64; d_off += 11) {
        for (size_t at : {size_t{0}, size_t{3}, size_t{8}, d_off}) {
          std::fill(dst.begin(), dst.end(), std::byte{0xEE});
          for (bool stream : {false, true}) {  // DA-43; DA-44 with DA-36's streamed stores
            std::fill(dst.begin(), dst.end(), std::byte{0xEE});
            uint64_t sum =
                stream ? cma::stream_copy_sum(dst.data() + d_off, src.data() + so, n, at)
                       : cma::cached_copy_sum(dst.data() + d_off, src.data() + so, n, at);
            ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + so, n), 0) << n << " " << so;
            ASSERT_EQ(sum, word_sum_at(src.data() + so, n, at)) << n << " " << so << " " << at;
            for (size_t i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], std::byte{0xEE}) << "before";
            for (size_t i = d_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], std::byte{0xEE});
          }
        }
      }
    }
  }
}

// DA-33, for each form of ending(): false for a live child (asked twice: the kept descriptor
// answers the same), true from kill() on, before and after the child is reaped.
void expect_ending_follows_a_kill(const std::function<bool(int)>& ending) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) ::pause();
  }
  EXPECT_FALSE(ending(child));
  EXPECT_FALSE(ending(child)) << "the kept descriptor answers the same";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // From kill() on: SIGKILL pending, then (after a few µs in which the child takes it) its
  // exit under way, then a zombie; true before it is reaped, whichever of those it meets.
  bool seen = false;
  for (int i = 0; i < 100000 && !seen; ++i) seen = ending(child);
  EXPECT_TRUE(seen);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(ending(child)) << "reaped";
  EXPECT_FALSE(ending(::getpid()));
}

TEST(Cma, AProcessHitBySigkillIsEndingBeforeItIsReapedAndAfter) {  // DA-33
  expect_ending_follows_a_kill(cma::ending);
}

TEST(Cma, TheStatFormAnswersTheSame) {  // DA-33, where process_mrelease is refused
  expect_ending_follows_a_kill(cma::detail::stat_says_ending);
}

TEST(Cma, TheProbeLeavesALiveProcessAlone) {  // DA-33
  if (cma::detail::mrelease_probe(::getpid()) < 0) GTEST_SKIP() << "process_mrelease refused here";
  // A live child's private memory, probed many times, is still there, byte for byte.
  constexpr size_t kBytes = size_t{8} << 20;
  std::vector<std::byte> mine(kBytes);
  for (size_t i = 0; i < kBytes; ++i) mine[i] = std::byte(i * 131 % 251);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (auto& b : mine) b = std::byte(uint8_t(b) ^ 0x5A);  // its own pages, not the parent's
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(cma::detail::mrelease_probe(child), 0);
  std::vector<std::byte> got(kBytes);
  iovec local{got.data(), kBytes}, remote{mine.data(), kBytes};
  EXPECT_EQ(::process_vm_readv(child, &local, 1, &remote, 1, 0), ssize_t(kBytes));
  bool same = true;
  for (size_t i = 0; i < kBytes && same; ++i) same = got[i] == std::byte(uint8_t(mine[i]) ^ 0x5A);
  EXPECT_TRUE(same) << "the probe changed a live process's memory";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(WindowCache, KeepsAWindowWhileUsedAndForgetsItWhenIdle) {  // DA-30
  std::byte* mem = anon(kRegion, 6);
  auto sp = shm::share_pages(mem, kRegion, kPage, nullptr);
  ASSERT_TRUE(sp && *sp);
  shm::WindowCache cache;
  auto t0 = shm::WindowCache::Clock::now();
  auto a = cache.get(::getpid(), (*sp)->ref(), t0);
  ASSERT_TRUE(a);
  EXPECT_EQ(cache.get(::getpid(), (*sp)->ref(), t0).get(), a.get());
  auto bad = (*sp)->ref();
  bad.ino += 1;
  EXPECT_FALSE(cache.get(::getpid(), bad, t0));  // remembered as unusable
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.sweep(t0 + std::chrono::seconds(5), std::chrono::seconds(1)), 1u)
      << "a window still held by an operation stays";
  a.reset();
  EXPECT_EQ(cache.sweep(t0 + std::chrono::seconds(5), std::chrono::seconds(1)), 0u);
  sp->reset();
  shm::wait_given_back();
  ::munmap(mem, kRegion);
}

}  // namespace
}  // namespace podium::data
