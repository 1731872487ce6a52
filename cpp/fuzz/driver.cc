// A seeded mutating fuzz driver for compilers without libFuzzer (GCC): it starts from the
// target's seeds (valid encodings), mutates them (bit flips, interesting bytes, insertions,
// deletions, length fields set to boundary values in either byte order, splices, repeats,
// truncations), feeds each result to LLVMFuzzerTestOneInput, and keeps some mutants as
// parents for later ones. Built with -fsanitize=address,undefined -fno-sanitize-recover=all,
// so any memory error or undefined behaviour ends the run as a crash.
//
//   fuzz_X [-max_total_time=SECONDS] [-runs=N] [-seed=N] [-max_len=BYTES] [FILE...]
//
// With FILEs it runs each file once (to reproduce a crash). It prints one summary line,
//   fuzz X: 123456 iterations in 10.0 s, 0 crashes
// and exits 0; on a crash it writes the input to crash-X-<seed>.bin, prints the summary with
// 1 crash, and exits non-zero.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "fuzz.h"

#if defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/common_interface_defs.h>
#define PODIUM_HAVE_SANITIZER_CALLBACK 1
#endif
#endif

// ASan: abort() (a failed check, an uncaught exception) is a crash report too; leaks count.
extern "C" const char* __asan_default_options() { return "handle_abort=1:detect_leaks=1"; }

namespace {

using podium::fuzz::Input;

const Input* g_current = nullptr;
uint64_t g_iterations = 0;
uint64_t g_seed = 0;
bool g_reported = false;

void report_crash() {
  if (g_reported) return;
  g_reported = true;
  std::string path = std::string("crash-") + podium::fuzz::kTargetName + "-" +
                     std::to_string(g_seed) + ".bin";
  if (g_current) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(g_current->data()),
               std::streamsize(g_current->size()));
  }
  std::fprintf(stderr, "fuzz %s: crash at iteration %llu; input (%zu bytes) written to %s\n",
               podium::fuzz::kTargetName, (unsigned long long)g_iterations,
               g_current ? g_current->size() : size_t{0}, path.c_str());
  std::printf("fuzz %s: %llu iterations, 1 crashes\n", podium::fuzz::kTargetName,
              (unsigned long long)g_iterations);
  std::fflush(stdout);
}

void on_signal(int sig) {
  report_crash();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

class Mutator {
 public:
  Mutator(uint64_t seed, size_t max_len) : rng_(seed), max_len_(max_len) {}

  Input mutate(const std::vector<Input>& pool) {
    Input in = pool[pick(pool.size())];
    int rounds = 1 + int(pick(4));
    for (int r = 0; r < rounds; ++r) step(in, pool);
    if (in.size() > max_len_) in.resize(max_len_);
    return in;
  }

 private:
  size_t pick(size_t n) { return n ? size_t(rng_() % n) : 0; }

  // Values that sit on the edges of length checks.
  uint64_t boundary(size_t width, size_t input_size) {
    uint64_t max = width == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * width)) - 1;
    switch (pick(12)) {
      case 0: return 0;
      case 1: return 1;
      case 2: return max;
      case 3: return max - 1;
      case 4: return max >> 1;
      case 5: return (max >> 1) + 1;
      case 6: return input_size;
      case 7: return input_size + 1 - std::min<size_t>(input_size, pick(3));
      case 8: return uint64_t(1) << pick(8 * width);
      case 9: return (uint64_t(1) << 31) & max;
      case 10: return ((uint64_t(1) << 31) - 1) & max;
      default: return rng_() & max;
    }
  }

  void put(Input& in, size_t at, uint64_t v, size_t width, bool big_endian) {
    for (size_t i = 0; i < width && at + i < in.size(); ++i) {
      size_t shift = big_endian ? 8 * (width - 1 - i) : 8 * i;
      in[at + i] = uint8_t(v >> shift);
    }
  }

  void step(Input& in, const std::vector<Input>& pool) {
    static constexpr uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xc0, 0xc1,
                                               0xcc, 0xcf, 0xd9, 0xdb, 0xdc, 0xdd, 0xde,
                                               0xdf, 0x90, 0x9f, 0x80, 0x8f, 0xa0, 0xbf};
    switch (pick(10)) {
      case 0:  // flip a bit
        if (!in.empty()) in[pick(in.size())] ^= uint8_t(1u << pick(8));
        break;
      case 1:  // an interesting byte (msgpack type bytes, edges)
        if (!in.empty()) in[pick(in.size())] = kInteresting[pick(sizeof kInteresting)];
        break;
      case 2: {  // insert random bytes
        size_t n = 1 + pick(16);
        Input ins(n);
        for (auto& b : ins) b = uint8_t(rng_());
        in.insert(in.begin() + std::ptrdiff_t(pick(in.size() + 1)), ins.begin(), ins.end());
        break;
      }
      case 3: {  // delete a range
        if (in.empty()) break;
        size_t at = pick(in.size());
        size_t n = std::min(in.size() - at, 1 + pick(16));
        in.erase(in.begin() + std::ptrdiff_t(at), in.begin() + std::ptrdiff_t(at + n));
        break;
      }
      case 4:
      case 5: {  // a length field to a boundary value: frame fields (LE), msgpack (BE)
        if (in.empty()) break;
        static constexpr size_t kWidths[] = {1, 2, 4, 8};
        size_t width = kWidths[pick(4)];
        size_t at;
        // Favour the frame prefix's fields and the part table.
        switch (pick(4)) {
          case 0: at = 6; width = 2; break;
          case 1: at = 8; width = 4; break;
          case 2: at = 12 + 8 * pick(4); width = 8; break;
          default: at = pick(in.size());
        }
        put(in, at, boundary(width, in.size()), width, pick(2) == 0);
        break;
      }
      case 6: {  // splice with another input
        const Input& other = pool[pick(pool.size())];
        size_t a = pick(in.size() + 1), b = pick(other.size() + 1);
        in.resize(a);
        in.insert(in.end(), other.begin() + std::ptrdiff_t(b), other.end());
        break;
      }
      case 7: {  // repeat a chunk
        if (in.empty()) break;
        size_t at = pick(in.size());
        size_t n = std::min(in.size() - at, 1 + pick(64));
        Input chunk(in.begin() + std::ptrdiff_t(at), in.begin() + std::ptrdiff_t(at + n));
        for (size_t k = 1 + pick(4); k > 0; --k) {
          in.insert(in.begin() + std::ptrdiff_t(at), chunk.begin(), chunk.end());
        }
        break;
      }
      case 8:  // truncate
        in.resize(pick(in.size() + 1));
        break;
      default:  // a random byte
        if (!in.empty()) in[pick(in.size())] = uint8_t(rng_());
    }
  }

  std::mt19937_64 rng_;
  size_t max_len_;
};

void run_one(const Input& in) {
  g_current = &in;
  LLVMFuzzerTestOneInput(in.data(), in.size());
  g_current = nullptr;
  ++g_iterations;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  uint64_t runs = 0;  // 0: until the time is up
  size_t max_len = 1 << 18;  // room for a seed that is a large part cut short
  g_seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? a.c_str() + n : nullptr;
    };
    if (auto v = value("-max_total_time=")) {
      seconds = std::atof(v);
    } else if (auto v2 = value("-runs=")) {
      runs = std::strtoull(v2, nullptr, 10);
    } else if (auto v3 = value("-seed=")) {
      g_seed = std::strtoull(v3, nullptr, 10);
    } else if (auto v4 = value("-max_len=")) {
      max_len = std::strtoull(v4, nullptr, 10);
    } else if (!a.empty() && a[0] != '-') {
      files.push_back(a);
    }
  }
#ifdef PODIUM_HAVE_SANITIZER_CALLBACK
  __sanitizer_set_death_callback(report_crash);
#endif
  std::set_terminate([] {
    report_crash();
    std::abort();
  });
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) ::signal(sig, on_signal);

  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (!files.empty()) {
    for (const auto& f : files) {
      std::ifstream is(f, std::ios::binary);
      Input in((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
      run_one(in);
    }
  } else {
    std::vector<Input> pool = podium::fuzz::seeds();
    if (pool.empty()) pool.emplace_back();
    const size_t kSeeds = pool.size();
    for (const auto& s : std::vector<Input>(pool)) run_one(s);  // the seeds themselves pass
    Mutator mutator(g_seed, max_len);
    std::mt19937_64 keep(g_seed ^ 0x9e3779b97f4a7c15ULL);
    while ((runs == 0 || g_iterations < runs) && (runs != 0 || elapsed() < seconds)) {
      Input in = mutator.mutate(pool);
      run_one(in);
      // Keep some mutants as parents, so mutations stack; the seeds always stay.
      if (keep() % 8 == 0) {
        if (pool.size() < 512) {
          pool.push_back(std::move(in));
        } else {
          pool[kSeeds + keep() % (pool.size() - kSeeds)] = std::move(in);
        }
      }
    }
  }
  std::printf("fuzz %s: %llu iterations in %.1f s, 0 crashes (seed %llu)\n",
              podium::fuzz::kTargetName, (unsigned long long)g_iterations, elapsed(),
              (unsigned long long)g_seed);
  return 0;
}
