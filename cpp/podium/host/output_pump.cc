#include "podium/host/output_pump.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "podium/base/env.h"
#include "podium/host/error.h"

namespace podium::host {

// ---- LogFile ----

Result<std::unique_ptr<LogFile>> LogFile::open(std::string path, uint64_t max_bytes) {
  std::error_code ec;
  auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return std::unexpected(
          make_error(HostErrc::kSpawnFailed, "mkdir " + dir.string() + ": " + ec.message()));
    }
    ::chmod(dir.c_str(), 0700);
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(errno_error("open " + path, errno));
  struct stat st {};
  ::fstat(fd, &st);
  return std::unique_ptr<LogFile>(new LogFile(std::move(path), std::max(max_bytes, kMinMaxBytes),
                                              UniqueFd(fd), static_cast<uint64_t>(st.st_size)));
}

namespace {
void flock_retry(int fd, int op) {
  while (::flock(fd, op) != 0 && errno == EINTR) {
  }
}

Status write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errno_error("write", errno));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return ok();
}
}  // namespace

void LogFile::lock() {
  if (fd_ && !locked_) flock_retry(fd_.get(), LOCK_EX);
  locked_ = true;
}

void LogFile::unlock() {
  if (fd_ && locked_) flock_retry(fd_.get(), LOCK_UN);
  locked_ = false;
}

Status LogFile::rotate() {
  std::string old = path_ + ".1";
  if (::rename(path_.c_str(), old.c_str()) != 0) {
    return std::unexpected(errno_error("rename " + path_, errno));
  }
  int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(errno_error("open " + path_, errno));
  // The new file is locked before the old one is closed (which drops its lock): a reader
  // never finds the current file unlocked while bytes read under the lock are unwritten.
  if (locked_) flock_retry(fd, LOCK_EX);
  fd_.reset(fd);
  size_ = 0;
  return ok();
}

Status LogFile::append(std::string_view data) {
  if (!fd_) {
    return std::unexpected(make_error(HostErrc::kStopped, "log file " + path_ + " is closed"));
  }
  // Whole lines, grouped so that no write passes the cap; a line longer than the cap is cut.
  while (!data.empty()) {
    uint64_t room = size_ < max_ ? max_ - size_ : 0;
    size_t take = 0;
    while (take < data.size()) {
      size_t nl = data.find('\n', take);
      size_t end = nl == std::string_view::npos ? data.size() : nl + 1;
      if (end > room) break;
      take = end;
    }
    if (take == 0) {
      if (size_ > 0) {
        if (auto s = rotate(); !s) return s;
        continue;
      }
      take = std::min<size_t>(data.size(), max_);  // one line longer than the cap
    }
    if (auto s = write_all(fd_.get(), data.substr(0, take)); !s) return s;
    size_ += take;
    data.remove_prefix(take);
  }
  return ok();
}

std::string proc_log_dir(std::string_view env_override) {
  if (!env_override.empty()) return std::string(env_override);
  if (const char* d = std::getenv("PODIUM_LOG_DIR"); d && *d) return d;
  std::string tmp = "/tmp";
  for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
    if (const char* t = std::getenv(name); t && *t) {
      tmp = t;
      break;
    }
  }
  while (tmp.size() > 1 && tmp.back() == '/') tmp.pop_back();
  return tmp + "/podium-logs-" + std::to_string(::getuid());
}

std::string proc_log_path(std::string_view dir, pid_t pid) {
  return std::string(dir) + "/proc-" + std::to_string(pid) + ".log";
}

uint64_t proc_log_max_bytes() {
  auto n = env_number("PODIUM_PROC_LOG_MAX_BYTES");
  if (!n) return LogFile::kDefaultMaxBytes;
  return std::max<uint64_t>(*n, LogFile::kMinMaxBytes);
}

Result<ProcPipeEnds> make_proc_pipes() {
  ProcPipeEnds ends;
  UniqueFd* r[3] = {&ends.read.out, &ends.read.err, &ends.read.log};
  UniqueFd* w[3] = {&ends.out_w, &ends.err_w, &ends.log_w};
  for (int i = 0; i < 3; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(errno_error("pipe2", errno));
    r[i]->reset(fds[0]);
    w[i]->reset(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  }
  return ends;
}

// ---- OutputPumps ----

namespace {

struct Pump {
  std::string name;
  std::unique_ptr<LogFile> file;
  OutputPumps::Sink sink;
  std::function<void()> on_done;
  struct Stream {
    int id = 0;  // 1, 2, or 0 (the log-only pipe)
    std::unique_ptr<asio::posix::stream_descriptor> sd;
    std::string partial;
  };
  Stream streams[3];
  int open = 0;
  bool file_error_reported = false;
  bool done = false;
  bool unregistered = false;  // never in pumps_ (added after stop())
};

}  // namespace

class OutputPumps::Impl : public std::enable_shared_from_this<OutputPumps::Impl> {
 public:
  Impl() : work_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }

  asio::io_context& io() { return io_; }

  void add(std::shared_ptr<Pump> p) {
    bool stopped;
    {
      std::lock_guard lock(mu_);
      ++active_;
      stopped = stopped_;
    }
    if (stopped) {  // no thread to pump: what the pipes hold now is written, then closed
      p->unregistered = true;
      finish(*p);
      return;
    }
    asio::post(io_, [self = shared_from_this(), p] {
      self->pumps_.insert(p);
      if (self->draining_) {
        self->finish(*p);
        return;
      }
      for (int i = 0; i < 3; ++i) {
        if (p->streams[i].sd) self->arm(p, i);
      }
      if (p->open == 0) self->finish(*p);
    });
  }

  void stop(std::chrono::milliseconds grace) {
    {
      std::unique_lock lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      cv_.wait_for(lock, grace, [&] { return active_ == 0; });
    }
    asio::post(io_, [self = shared_from_this()] {
      self->draining_ = true;
      auto pumps = self->pumps_;
      for (auto& p : pumps) self->finish(*p);
    });
    work_.reset();
    if (thread_.joinable()) thread_.join();  // never called from a sink or on_done
  }

  size_t active() {
    std::lock_guard lock(mu_);
    return active_;
  }

 private:
  void arm(const std::shared_ptr<Pump>& p, int i) {
    p->streams[i].sd->async_wait(
        asio::posix::stream_descriptor::wait_read,
        [self = shared_from_this(), p, i](const std::error_code& ec) {
          if (p->done || !p->streams[i].sd) return;
          if (ec) {  // the descriptor failed: what it holds is read, then it is closed
            self->pump(*p, i, true);
            return;
          }
          if (!self->pump(*p, i, false)) self->arm(p, i);
        });
  }

  // Reads what stream i holds now, writes its whole lines; true when it reached end-of-file
  // (or `last`: drain and close), which closes it.
  bool pump(Pump& p, int i, bool last) {
    auto& s = p.streams[i];
    std::string lines;
    bool eof = false;
    if (p.file) p.file->lock();  // OP-3: held from the read to the write
    char buf[65536];
    size_t total = 0;
    while (total < (1u << 20)) {
      ssize_t n = ::read(s.sd->native_handle(), buf, sizeof buf);
      if (n > 0) {
        total += static_cast<size_t>(n);
        s.partial.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      eof = true;  // 0: every writer is gone; an error: nothing more will come
      break;
    }
    if (last) eof = true;
    size_t cut = s.partial.rfind('\n');
    if (cut != std::string::npos) {
      lines = s.partial.substr(0, cut + 1);
      s.partial.erase(0, cut + 1);
    }
    while (s.partial.size() >= kMaxLine) {
      lines.append(s.partial, 0, kMaxLine).push_back('\n');
      s.partial.erase(0, kMaxLine);
    }
    if (eof && !s.partial.empty()) {
      lines.append(s.partial).push_back('\n');
      s.partial.clear();
    }
    if (!lines.empty() && p.file) {
      if (auto st = p.file->append(lines); !st && !p.file_error_reported) {
        p.file_error_reported = true;
        spdlog::warn("podium: proc {}: cannot write its log file {}: {}", p.name, p.file->path(),
                     st.error().to_string());
      }
    }
    if (p.file) p.file->unlock();
    if (!lines.empty() && s.id != 0 && p.sink) p.sink(s.id, lines);
    if (eof) {
      s.sd.reset();
      if (--p.open == 0) finish(p);
    }
    return eof;
  }

  // Ends a pump: drains and closes its open streams, then on_done (OP-2).
  void finish(Pump& p) {
    if (p.done) return;
    for (int i = 0; i < 3; ++i) {
      if (p.streams[i].sd) pump(p, i, true);  // reaches finish() again with open == 0
    }
    if (p.done) return;
    p.done = true;
    p.file.reset();
    auto done = std::move(p.on_done);
    for (auto it = pumps_.begin(); !p.unregistered && it != pumps_.end(); ++it) {
      if (it->get() == &p) {
        pumps_.erase(it);
        break;
      }
    }
    {
      std::lock_guard lock(mu_);
      --active_;
    }
    cv_.notify_all();
    if (done) done();
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  std::unordered_set<std::shared_ptr<Pump>> pumps_;  // the io thread only
  bool draining_ = false;                            // the io thread only
  std::mutex mu_;  // guards active_, stopped_; a leaf
  std::condition_variable cv_;
  size_t active_ = 0;
  bool stopped_ = false;
};

OutputPumps::OutputPumps() : impl_(std::make_shared<Impl>()) {}
OutputPumps::~OutputPumps() { stop(); }

void OutputPumps::add(std::string name, ProcPipes pipes, std::unique_ptr<LogFile> file, Sink sink,
                      std::function<void()> on_done) {
  // The io_context is the impl's; the descriptors are created here and used only there.
  auto p = std::make_shared<Pump>();
  p->name = std::move(name);
  p->file = std::move(file);
  p->sink = std::move(sink);
  p->on_done = std::move(on_done);
  UniqueFd* fds[3] = {&pipes.out, &pipes.err, &pipes.log};
  int ids[3] = {1, 2, 0};
  for (int i = 0; i < 3; ++i) {
    p->streams[i].id = ids[i];
    if (!*fds[i]) continue;
    p->streams[i].sd =
        std::make_unique<asio::posix::stream_descriptor>(impl_->io(), fds[i]->release());
    ++p->open;
  }
  impl_->add(std::move(p));
}

void OutputPumps::stop(std::chrono::milliseconds grace) { impl_->stop(grace); }
size_t OutputPumps::active() const { return impl_->active(); }

}  // namespace podium::host
