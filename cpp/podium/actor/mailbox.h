// podium::actor::Mailbox — one actor's queue and life cycle inside a Proc.
//
// A Mailbox (one per actor incarnation) holds the items queued for its actor: messages, and
// its construct, stop and fail. Items run in order, one at a time (AC-6), on whichever thread
// drains it (drive.h): a posted drain on a runner, a batch's runner, or a helping caller. A
// drain runs at most kDrainBudget items, then yields its thread to other actors. The actor's
// state moves created -> running -> stopped or failed, never back; once stopped or failed,
// queued and later messages are refused with the cause (AC-8, AC-9).
//
// The functions that act on it (enqueue, drain, construct, stop, fail) are Proc::Impl's, in
// mailbox.cc, as they route replies and refusals through the proc.
//
// Threads: `mu` guards the fields marked so; `actor` and `factory` are touched only by the
// thread inside drain() (`running` makes it one at a time); the rest is immutable after the
// mailbox is made.
// Invariants: AC-6, AC-8, AC-9 and AC-10 (proc.h, drive.h) are kept here.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "podium/actor/actor.h"
#include "podium/actor/ids.h"
#include "podium/base/error.h"
#include "podium/wire/envelope.h"

namespace podium::actor {

// Messages an actor handles per turn before yielding its runner to other actors.
inline constexpr int kDrainBudget = 64;

struct Mailbox {
  struct Item {
    enum class Type : uint8_t { kMessage, kConstruct, kStop, kFail };
    Type type = Type::kMessage;
    wire::Envelope env;
    std::function<void(Status)> done;  // kStop
    Error cause = {};                  // kFail
  };
  enum class State : uint8_t { kCreated, kRunning, kStopped, kFailed };

  ActorId id;
  std::string key;                   // id.local_key()
  std::string id_text;               // id.to_string()
  uint64_t stream = 0;               // AC-11's stream of this incarnation (ordering.h AC-16)
  ActorFactory factory;              // consumed by the kConstruct item (drain only)
  std::unique_ptr<ActorBase> actor;  // drain only

  std::mutex mu;  // guards the fields below
  // Where its failure is reported (SV-1): the owner process's address and the mesh's id
  // there; empty when nobody supervises it. A new owner may take over (SV-5, "adopt").
  std::string supervisor;
  uint64_t supervision_id = 0;
  std::deque<Item> queue;
  bool scheduled = false;  // a drain is posted (or the queue is being drained)
  bool running = false;    // a thread is inside drain() for this mailbox
  State state = State::kCreated;
  Error cause;  // why it failed or stopped

  bool ended() const { return state == State::kStopped || state == State::kFailed; }
};

}  // namespace podium::actor
