// The typed C++ actor API: an actor is a class, its endpoints are registered in one line.
//
//   class Counter : public podium::Actor {
//    public:
//     explicit Counter(int start) : n_(start) {}
//     int incr(int by) { return n_ += by; }
//     std::string whoami() { return self().to_string(); }
//     PODIUM_ENDPOINTS(Counter, incr, whoami)
//    private:
//     int n_;
//   };
//   PODIUM_ACTOR(Counter, int)   // at namespace scope: spawnable by name, constructor (int)
//
// Arguments and results are anything msgpack-cxx encodes. Endpoints run one at a time per
// actor (AC-6). An endpoint that throws answers the caller with an error (kHandlerFailed)
// carrying the exception's what(); the actor lives on. Include this header only where actors
// are defined or called: it carries the templates.
#pragma once

#include <array>
#include <cstring>
#include <memory>
#include <msgpack.hpp>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "podium/actor/actor.h"
#include "podium/actor/proc.h"
#include "podium/wire/peer_msgpack.h"

namespace podium {

class Actor {
 public:
  virtual ~Actor() = default;

 protected:
  // Valid inside an endpoint: this actor's id, and its rank within the call's mesh.
  const actor::ActorId& self() const { return *cx_->self_id; }
  uint64_t rank() const { return cx_->rank; }
  actor::Proc& proc() const { return *cx_->proc; }
  // Runs once when the actor is stopped, after the messages queued before the stop.
  virtual void cleanup() {}

 private:
  template <class A>
  friend class detail_TypedActor;
  struct CurrentCall {
    const actor::ActorId* self_id = nullptr;
    uint64_t rank = 0;
    actor::Proc* proc = nullptr;
  };
  CurrentCall* cx_ = nullptr;
  CurrentCall current_;
};

namespace detail {

// msgpack-cxx reports type mismatches with exceptions; the core turns them into Errors here.
template <class T>
Buffer pack(const T& value) {
  // Encode into a per-thread scratch buffer, then one allocation for bytes and count. A
  // large value costs one copy; the arguments of a call are usually small.
  thread_local msgpack::sbuffer sb(256);
  sb.clear();
  msgpack::pack(sb, value);
  return Buffer::copy_of(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(sb.data()), sb.size()));
}

template <class T>
Result<T> unpack(const Buffer& b, std::string_view what) {
  // A per-thread zone, reset after each decode: no 8 KiB allocation per message.
  thread_local msgpack::zone zone;
  struct Reset {
    msgpack::zone& z;
    ~Reset() { z.clear(); }
  } reset{zone};
  try {
    return msgpack::unpack(zone, reinterpret_cast<const char*>(b.data()), b.size(), nullptr,
                           nullptr, wire::peer_unpack_limit(b.size()))
        .as<T>();
  } catch (const std::exception& e) {
    return std::unexpected(make_error(actor::ActorErrc::kBadArguments,
                                      std::string(what) + ": " + e.what()));
  }
}

template <class M>
struct MemberTraits;
template <class R, class C, class... P>
struct MemberTraits<R (C::*)(P...)> {
  using Result = R;
  using Class = C;
  using Params = std::tuple<std::decay_t<P>...>;
};
template <class R, class C, class... P>
struct MemberTraits<R (C::*)(P...) const> : MemberTraits<R (C::*)(P...)> {};

// A member pointer's bytes identify the endpoint at the call site without a name.
using EndpointKey = std::array<unsigned char, 2 * sizeof(void*)>;
template <class M>
EndpointKey endpoint_key(M m) {
  static_assert(sizeof(M) <= sizeof(EndpointKey), "unsupported member pointer layout");
  EndpointKey key{};
  std::memcpy(key.data(), &m, sizeof(M));
  return key;
}

template <class A>
struct Endpoint {
  std::string_view name;
  EndpointKey key;
  // Runs the endpoint; encodes its result only when `want_result` (one-way calls skip it).
  Result<Buffer> (*invoke)(A&, const Buffer& args, bool want_result);
};

template <class A, auto M>
Result<Buffer> invoke(A& actor, const Buffer& args, bool want_result) {
  using T = MemberTraits<decltype(M)>;
  auto decoded = unpack<typename T::Params>(args, "arguments");
  if (!decoded) return std::unexpected(decoded.error());
  try {
    if constexpr (std::is_void_v<typename T::Result>) {
      std::apply([&](auto&... xs) { (actor.*M)(xs...); }, *decoded);
      return want_result ? pack(msgpack::type::nil_t()) : Buffer();
    } else {
      auto r = std::apply([&](auto&... xs) { return (actor.*M)(xs...); }, *decoded);
      return want_result ? pack(r) : Buffer();
    }
  } catch (const std::exception& e) {
    return std::unexpected(make_error(actor::ActorErrc::kHandlerFailed, e.what()));
  }
}

template <class A, auto M>
Endpoint<A> endpoint_entry(std::string_view name) {
  return Endpoint<A>{name, endpoint_key(M), &invoke<A, M>};
}

template <class A, class M>
Result<std::string_view> endpoint_name(M m) {
  auto key = endpoint_key(m);
  for (const auto& ep : A::podium_endpoint_table()) {
    if (ep.key == key) return ep.name;
  }
  return std::unexpected(make_error(actor::ActorErrc::kNoSuchEndpoint,
                                    "member function is not listed in PODIUM_ENDPOINTS"));
}

}  // namespace detail

// The ActorBase that runs a typed actor's endpoints.
template <class A>
class detail_TypedActor final : public actor::ActorBase {
 public:
  explicit detail_TypedActor(std::unique_ptr<A> a) : actor_(std::move(a)) {}

  Status handle(wire::Envelope&& msg, actor::Context& cx) override {
    const actor::CallHeader* call = cx.call();
    if (!call) {
      cx.reply_error(make_error(actor::ActorErrc::kBadArguments, "typed actors take calls only"));
      return ok();
    }
    const detail::Endpoint<A>* ep = nullptr;
    for (const auto& e : A::podium_endpoint_table()) {
      if (e.name == call->endpoint) ep = &e;
    }
    if (!ep) {
      cx.reply_error(make_error(actor::ActorErrc::kNoSuchEndpoint,
                                cx.self().to_string() + " has no endpoint '" + call->endpoint +
                                    "'"));
      return ok();
    }
    Actor& base = *actor_;
    base.current_ = Actor::CurrentCall{&cx.self(), call->rank, &cx.proc()};
    base.cx_ = &base.current_;
    static const Buffer kNoArgs = detail::pack(std::tuple<>());
    auto out = ep->invoke(*actor_, msg.parts.size() > 1 ? msg.parts[1] : kNoArgs,
                          cx.expects_reply());
    base.cx_ = nullptr;
    if (out) {
      cx.reply({std::move(*out)});
    } else {
      Error e = std::move(out.error());
      e.message = cx.self().to_string() + "." + std::string(ep->name) + ": " + e.message;
      if (!cx.expects_reply()) return std::unexpected(std::move(e));  // one-way: the actor fails
      cx.reply_error(std::move(e));
    }
    return ok();
  }

  void cleanup(actor::Context& cx) override {
    Actor& base = *actor_;
    base.current_ = Actor::CurrentCall{&cx.self(), 0, &cx.proc()};
    base.cx_ = &base.current_;
    base.cleanup();
    base.cx_ = nullptr;
  }

 private:
  std::unique_ptr<A> actor_;
};

namespace detail {

template <class A, class... CtorArgs>
bool register_typed(const char* name) {
  actor::register_actor_type(
      name,
      [](std::vector<Buffer> args, actor::Context&) -> Result<std::unique_ptr<actor::ActorBase>> {
        static const Buffer kNoArgs = pack(std::tuple<>());
        auto decoded =
            unpack<std::tuple<std::decay_t<CtorArgs>...>>(args.empty() ? kNoArgs : args[0],
                                                          "constructor arguments");
        if (!decoded) return std::unexpected(decoded.error());
        try {
          auto a = std::apply([](auto&... xs) { return std::make_unique<A>(xs...); }, *decoded);
          return std::make_unique<detail_TypedActor<A>>(std::move(a));
        } catch (const std::exception& e) {
          return std::unexpected(make_error(actor::ActorErrc::kHandlerFailed, e.what()));
        }
      });
  return true;
}

template <class... T>
struct TypeList {};

}  // namespace detail
}  // namespace podium

// --- registration macros -----------------------------------------------------------------

#define PODIUM_PARENS ()
#define PODIUM_EXPAND(...) PODIUM_EXPAND3(PODIUM_EXPAND3(PODIUM_EXPAND3(PODIUM_EXPAND3(__VA_ARGS__))))
#define PODIUM_EXPAND3(...) PODIUM_EXPAND2(PODIUM_EXPAND2(PODIUM_EXPAND2(PODIUM_EXPAND2(__VA_ARGS__))))
#define PODIUM_EXPAND2(...) PODIUM_EXPAND1(PODIUM_EXPAND1(PODIUM_EXPAND1(PODIUM_EXPAND1(__VA_ARGS__))))
#define PODIUM_EXPAND1(...) __VA_ARGS__
#define PODIUM_FOR_EACH(macro, cls, ...) \
  __VA_OPT__(PODIUM_EXPAND(PODIUM_FOR_EACH_HELPER(macro, cls, __VA_ARGS__)))
#define PODIUM_FOR_EACH_HELPER(macro, cls, a1, ...) \
  macro(cls, a1) __VA_OPT__(, PODIUM_FOR_EACH_AGAIN PODIUM_PARENS(macro, cls, __VA_ARGS__))
#define PODIUM_FOR_EACH_AGAIN() PODIUM_FOR_EACH_HELPER
#define PODIUM_ENDPOINT_ENTRY(cls, name) ::podium::detail::endpoint_entry<cls, &cls::name>(#name)

// Inside the class body: lists the member functions callable as endpoints.
#define PODIUM_ENDPOINTS(Class, ...)                                                       \
  static const auto& podium_endpoint_table() {                                             \
    static const std::array table{PODIUM_FOR_EACH(PODIUM_ENDPOINT_ENTRY, Class, __VA_ARGS__)}; \
    return table;                                                                          \
  }

// At namespace scope (the class's own namespace): makes Class spawnable by name in every proc
// of this binary, constructed from the listed argument types.
#define PODIUM_ACTOR(Class, ...)                                                             \
  [[maybe_unused]] inline const char* podium_actor_type_name(Class*) { return #Class; }     \
  [[maybe_unused]] inline ::podium::detail::TypeList<__VA_ARGS__>* podium_actor_ctor_args(  \
      Class*) {                                                                              \
    return nullptr;                                                                          \
  }                                                                                          \
  [[maybe_unused]] inline const bool podium_actor_registered_##Class =                       \
      ::podium::detail::register_typed<Class __VA_OPT__(, ) __VA_ARGS__>(#Class);
