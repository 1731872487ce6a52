#include "podium/actor/busy_wait.h"

namespace podium::actor {

BusyWaitGuard& BusyWaitGuard::mine() {
  thread_local BusyWaitGuard guard;
  return guard;
}

}  // namespace podium::actor
