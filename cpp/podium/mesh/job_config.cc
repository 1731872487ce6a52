#include "podium/mesh/job_config.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace podium::mesh::internal {
namespace {

std::atomic<bool> g_generated{false};

Result<std::string> read_file(const char* what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::unexpected(
        make_error(BaseErrc::kIo, std::string(what) + " " + path + ": cannot read it"));
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

Result<std::string> job_secret() {
  if (const char* s = std::getenv("PODIUM_SECRET"); s && *s) return std::string(s);
  const char* path = std::getenv("PODIUM_SECRET_FILE");
  if (!path || !*path) return std::string();
  auto secret = read_file("PODIUM_SECRET_FILE", path);
  if (!secret) return secret;
  while (!secret->empty() && (secret->back() == '\n' || secret->back() == '\r')) {
    secret->pop_back();
  }
  if (secret->empty()) {
    return std::unexpected(make_error(BaseErrc::kInvalidArgument,
                                      std::string("PODIUM_SECRET_FILE ") + path + " is empty"));
  }
  return secret;
}

// Each variable is a PEM file's path, or PEM text itself (a value that contains "-----BEGIN"),
// which is how Python's attach_to_workers(ca=bytes, ...) passes them on; the certificate and key
// variables may name one file that holds both. Procs inherit the variables, so every process of
// the job runs TLS with the same CA.
Result<channel::TlsConfig> job_tls() {
  constexpr std::array<const char*, 3> kNames = {"PODIUM_TLS_CERT", "PODIUM_TLS_KEY",
                                                 "PODIUM_TLS_CA"};
  std::array<std::string, 3> values;
  std::string missing;
  size_t set = 0;
  for (size_t i = 0; i < kNames.size(); ++i) {
    const char* v = std::getenv(kNames[i]);
    if (v && *v) {
      values[i] = v;
      ++set;
    } else {
      missing += std::string(missing.empty() ? "" : ", ") + kNames[i];
    }
  }
  if (set == 0) return channel::TlsConfig{};
  if (!missing.empty()) {
    return std::unexpected(make_error(
        BaseErrc::kInvalidArgument,
        "TLS needs PODIUM_TLS_CERT, PODIUM_TLS_KEY and PODIUM_TLS_CA together; not set: " +
            missing));
  }
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (values[i].find("-----BEGIN") != std::string::npos) continue;
    auto text = read_file(kNames[i], values[i]);
    if (!text) return std::unexpected(text.error());
    values[i] = std::move(*text);
  }
  channel::TlsConfig tls{std::move(values[0]), std::move(values[1]), std::move(values[2])};
  if (auto st = channel::check_tls_config(tls); !st) {
    return std::unexpected(make_error(
        BaseErrc::kInvalidArgument,
        "PODIUM_TLS_CERT, PODIUM_TLS_KEY, PODIUM_TLS_CA: " + st.error().message));
  }
  return tls;
}

bool insecure_requested() {
  const char* v = std::getenv("PODIUM_INSECURE");
  return v && std::string_view(v) == "1";
}

Result<bool> ensure_controller_secret(const std::string& dir) {
  auto given = job_secret();
  if (!given) return std::unexpected(given.error());
  if (!given->empty() || insecure_requested()) return false;
  std::array<uint8_t, 32> raw{};
  size_t got = 0;
  while (got < raw.size()) {
    ssize_t n = ::getrandom(raw.data() + got, raw.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::unexpected(errno_error("getrandom for the job secret", errno));
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * raw.size() + 1);
  for (uint8_t b : raw) {
    text += kHex[b >> 4];
    text += kHex[b & 15];
  }
  text += '\n';
  std::string path = dir + "/secret";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(errno_error("create " + path, errno));
  ssize_t w = ::write(fd, text.data(), text.size());
  int err = errno;
  ::close(fd);
  if (w != static_cast<ssize_t>(text.size())) {
    ::unlink(path.c_str());
    return std::unexpected(errno_error("write " + path, w < 0 ? err : EIO));
  }
  if (::setenv("PODIUM_SECRET_FILE", path.c_str(), 1) != 0) {
    return std::unexpected(errno_error("setenv PODIUM_SECRET_FILE", errno));
  }
  g_generated.store(true, std::memory_order_relaxed);
  return true;
}

bool secret_was_generated() { return g_generated.load(std::memory_order_relaxed); }

size_t sweep_stale_socket_dirs(const std::string& user_dir) {
  size_t removed = 0;
  DIR* d = ::opendir(user_dir.c_str());
  if (!d) return 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    size_t dash = name.find('-');
    if (dash == 0 || dash == std::string_view::npos) continue;
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(name.data(), name.data() + dash, pid);
    if (ec != std::errc() || end != name.data() + dash || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // running (or not ours to judge)
    std::error_code rm;
    if (std::filesystem::remove_all(user_dir + "/" + std::string(name), rm) > 0 && !rm) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace podium::mesh::internal
