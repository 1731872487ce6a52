// podium::mesh::cancel_when_ready — ends a stop's grace timer as soon as the stop is done.
//
// A stop arms a timer that escalates (kills) after its grace period; its pending wait holds
// what the escalation needs (the collector, the keys). Left to expire, every stop that
// finished in time kept that for the whole grace (10 s), so a controller cycling meshes held
// ~10 KB per cycle of the last 10 s, and its heap's high-water mark (RSS) grew with the
// cycle rate (docs/benchmarks.md, "podium bench soak").
//
// Threads: any. The timer must have its wait set before this is called; nothing else calls
// its members afterwards (cancel() is then the only call, once, and the handler never
// touches the timer object).
#pragma once

#include <memory>

#include "podium/actor/future.h"

namespace podium::mesh {

// `Timer`: an asio::steady_timer or a base::Timer (clock_timer.h), which cancel alike.
template <class Timer, class T>
void cancel_when_ready(const std::shared_ptr<Timer>& timer, const actor::Future<T>& done) {
  done.on_ready([weak = std::weak_ptr<Timer>(timer)](const Result<T>&) {
    if (auto t = weak.lock()) t->cancel();  // the handler runs now, with operation_aborted
  });
}

}  // namespace podium::mesh
