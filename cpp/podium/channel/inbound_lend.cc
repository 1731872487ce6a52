// The receiving side of lent parts (CH-25, CH-26; docs/channel.md, "Lent parts"): the
// probe at the Hello, the pull of a Data frame's lent parts off the io threads, and its
// delivery once they are in. Part of Inbound (inbound.h).
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <asio/post.hpp>
#include <spdlog/spdlog.h>

#include "podium/channel/inbound.h"
#include "podium/channel/pull.h"
#include "podium/channel/shared_parts.h"

namespace podium::channel::internal {

using R = Core::Refusal;

bool Inbound::probe_lender(const wire::Hello& hello) {
  if (!(hello.flags & wire::kHelloLend) || transport_ != Transport::kUnix ||
      !core_->config.pull_lent) {
    return false;
  }
  // Pull only from the process the kernel says is at the other end, and only once we have
  // read its probe there (a ptrace policy, a seccomp profile or another pid namespace make
  // it fail: then every part comes inline).
  ucred cred{};
  socklen_t len = sizeof cred;
  int e = ::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0
              ? errno
          : cred.pid <= 0 ? ESRCH
                          : probe_peer(cred.pid, hello.probe_addr, hello.probe_value);
  if (e != 0) {
    spdlog::debug("channel: {} offers lent parts; they come inline: reading its memory: {}",
                  peer_, std::strerror(e));
    return false;
  }
  pull_pid_ = cred.pid;
  return true;
}

bool Inbound::lent_fit(const wire::Data& d) {
  // The frame's limit covers its lent parts too, checked before anything is allocated.
  const uint64_t max = core_->config.max_frame_bytes;
  uint64_t total = 0;  // at most max
  bool over = false;
  for (const auto& l : d.lent) {
    over = over || l.len > max - total;
    if (!over) total += l.len;
  }
  if (over) {
    close("frame with lent parts of more than " + std::to_string(max) +
              " bytes exceeds the limit",
          R::kOversize);
  }
  return !over;
}

Inbound::Frames Inbound::start_pull(wire::Data&& d) {
  // The read chain waits (later frames of this link stay in decoder_) while the puller
  // threads copy; other connections go on.
  {
    std::lock_guard lock(core_->pull_mu);
    if (core_->pulls_closed) {
      close("net stopped", R::kNone);
      return Frames::kClosed;
    }
    ++core_->pulls_in_flight;
  }
  std::vector<wire::LentPart> lent = d.lent;
  pulling_ = std::move(d);
  auto done = [self = shared_from_this()](int err, std::vector<Buffer> p) mutable {
    auto core = self->core_;
    std::lock_guard lock(core->pull_mu);
    if (!core->pulls_closed) {
      asio::post(core->io, [self = std::move(self), err, p = std::move(p)]() mutable {
        self->on_pulled(err, std::move(p));
      });
    }
    self.reset();  // before stop() may return: it may be the last holder
    if (--core->pulls_in_flight == 0) core->pull_cv.notify_all();
  };
  // CH-29: parts in shared blocks this process has mapped already are claimed here, with no
  // system call; when that is all of them, the frame skips the pullers' thread hop.
  std::vector<Buffer> ready(lent.size());
  size_t taken = 0;
  for (size_t i = 0; i < lent.size(); ++i) {
    if (auto b = map_shared(pull_pid_, lent[i], /*mapped_only=*/true)) {
      ready[i] = std::move(*b);
      ++taken;
    }
  }
  if (taken == lent.size()) {
    done(0, std::move(ready));
  } else {
    pull_async(pull_pid_, lent, core_->pull_cancel, std::move(done),
               taken > 0 ? std::move(ready) : std::vector<Buffer>{});
  }
  return Frames::kPulling;
}

void Inbound::on_pulled(int err, std::vector<Buffer> parts) {
  wire::Data d = std::move(*pulling_);
  pulling_.reset();
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
  }
  if (err != 0) {
    // CH-25: the sender resends on its next connection (and re-probes); it is told nothing
    // was delivered by the close.
    close("could not pull lent parts of " + std::to_string(d.lent.size()) + " from pid " +
              std::to_string(pull_pid_) + ": " + std::strerror(err),
          R::kMalformed);
    return;
  }
  // CH-26: the sender closes the connection before it releases lent memory; open now, after
  // the copy, means the bytes were the sender's throughout it.
  pollfd p{socket_.native_handle(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
    close("the peer closed the connection while its lent parts were pulled", R::kNone);
    return;
  }
  Gate::Scope gate(core_->gate);
  if (!gate) {
    close("net stopped", R::kNone);
    return;
  }
  BatchEnd batch{*core_};
  {
    std::unique_lock<std::mutex> delivering(session_->mu);
    for (size_t i = 0; i < d.lent.size(); ++i) {
      d.envelope.parts[d.lent[i].index] = std::move(parts[i]);
    }
    if (d.seq > session_->delivered.load(std::memory_order_relaxed)) {
      if (core_->gate.closed()) {
        close("net stopped", R::kNone);
        return;
      }
      deliver_data(d, batch);
    }
    {
      // CH-26: the ack releases the sender's memory: it goes now, not with the batch.
      std::lock_guard lock(mu_);
      if (closed_) return;
      ack_locked();
    }
    if (deliver_frames(batch, delivering) != Frames::kDone) return;
  }
  after_frames();
}

}  // namespace podium::channel::internal
