// podium::ActorMesh<A> — typed calls on a mesh of C++ actors of class A.
//
//   auto sums  = counters.call(&Counter::incr, 1).get();     // Result<ValueMesh<int>>
//   auto one   = counters.call_one(&Counter::incr, 1).get(); // Result<int>; one actor only
//   auto any   = counters.choose(&Counter::incr, 1).get();   // the least-loaded actor
//   counters.broadcast(&Counter::incr, 1);                   // one-way
//
// Arguments are checked against the endpoint's parameter types at compile time and encoded
// with msgpack. A call resolves to an error if any actor's endpoint failed, naming its rank.
#pragma once

#include <tuple>
#include <variant>
#include <type_traits>

#include "podium/actor/typed.h"
#include "podium/mesh/proc_mesh.h"
#include "podium/mesh/value_mesh.h"

namespace podium {

// What a call of an endpoint returning R yields: R, or std::monostate for void endpoints.
template <class M>
using EndpointValue = std::conditional_t<std::is_void_v<typename detail::MemberTraits<M>::Result>,
                                         std::monostate, typename detail::MemberTraits<M>::Result>;

template <class A>
class ActorMesh : public ActorMeshBase {
 public:
  explicit ActorMesh(ActorMeshBase base) : ActorMeshBase(std::move(base)) {}

  [[nodiscard]] Result<ActorMesh> slice(std::string_view label, int64_t index) const {
    return wrap(ActorMeshBase::slice(label, index));
  }
  [[nodiscard]] Result<ActorMesh> slice(std::string_view label, ndslice::Range range) const {
    return wrap(ActorMeshBase::slice(label, range));
  }

  template <class M, class... Args>
  auto call(M endpoint, Args&&... args) const -> actor::Future<ValueMesh<EndpointValue<M>>> {
    using R = EndpointValue<M>;
    auto name = detail::endpoint_name<A>(endpoint);
    if (!name) return failed<ValueMesh<R>>(name.error());
    auto raw = call_raw(*name, {encode_args<M>(std::forward<Args>(args)...)});
    actor::Promise<ValueMesh<R>> p;
    auto out = p.future();
    raw.on_ready([p = std::make_shared<actor::Promise<ValueMesh<R>>>(std::move(p)),
                  extent = extent(), self = *this](const Result<mesh::Replies>& replies) {
      if (!replies) return (void)p->set(std::unexpected(replies.error()));
      // One decode per run of equal replies (ME-9), not per rank.
      ValueMesh<R> out(extent);
      for (size_t i = 0; i < replies->runs(); ++i) {
        auto v = decode<R>(replies->run_value(i));
        if (!v) return (void)p->set(std::unexpected(self.error_at(replies->run_begin(i), v.error())));
        out.append(replies->run_end(i) - replies->run_begin(i), std::move(*v));
      }
      p->set(std::move(out));
    });
    return out;
  }

  // The mesh must hold exactly one actor.
  template <class M, class... Args>
  auto call_one(M endpoint, Args&&... args) const
      -> actor::Future<EndpointValue<M>> {
    using R = EndpointValue<M>;
    if (size() != 1) {
      return failed<R>(make_error(BaseErrc::kInvalidArgument,
                                  "call_one needs a mesh of exactly one actor; '" + name() +
                                      "' has " + std::to_string(size()) + " in " +
                                      extent().to_string()));
    }
    return call_rank<M>(0, endpoint, std::forward<Args>(args)...);
  }

  // Calls the actor with the fewest calls outstanding.
  template <class M, class... Args>
  auto choose(M endpoint, Args&&... args) const
      -> actor::Future<EndpointValue<M>> {
    return call_rank<M>(least_loaded_rank(), endpoint, std::forward<Args>(args)...);
  }

  template <class M, class... Args>
  Status broadcast(M endpoint, Args&&... args) const {
    auto name = detail::endpoint_name<A>(endpoint);
    if (!name) return std::unexpected(name.error());
    broadcast_raw(*name, {encode_args<M>(std::forward<Args>(args)...)});
    return ok();
  }

 private:
  static Result<ActorMesh> wrap(Result<ActorMeshBase> b) {
    if (!b) return std::unexpected(b.error());
    return ActorMesh(std::move(*b));
  }

  template <class T>
  static actor::Future<T> failed(Error e) {
    actor::Promise<T> p;
    p.set(std::unexpected(std::move(e)));
    return p.future();
  }

  template <class M, class... Args>
  static Buffer encode_args(Args&&... args) {
    using Params = typename detail::MemberTraits<M>::Params;
    static_assert(std::tuple_size_v<Params> == sizeof...(Args),
                  "wrong number of arguments for this endpoint");
    return detail::pack(Params(std::forward<Args>(args)...));
  }

  template <class R>
  static Result<R> decode(const mesh::Reply& reply) {
    if (!reply) return std::unexpected(reply.error());
    if (reply->empty()) {
      return std::unexpected(make_error(actor::ActorErrc::kBadArguments, "reply without a value"));
    }
    if constexpr (std::is_same_v<R, std::monostate>) {
      return std::monostate{};
    } else {
      return detail::unpack<R>((*reply)[0], "reply");
    }
  }

  Error error_at(size_t rank, const Error& cause) const {
    auto base = region().base_rank(rank);
    return mesh::rank_error(extent(), rank, st_->targets[base ? *base : 0], cause);
  }

  template <class M, class... Args>
  auto call_rank(size_t rank, M endpoint, Args&&... args) const
      -> actor::Future<EndpointValue<M>> {
    using R = EndpointValue<M>;
    auto name = detail::endpoint_name<A>(endpoint);
    if (!name) return failed<R>(name.error());
    auto raw = call_rank_raw(rank, *name, {encode_args<M>(std::forward<Args>(args)...)});
    actor::Promise<R> p;
    auto out = p.future();
    raw.on_ready([p = std::make_shared<actor::Promise<R>>(std::move(p)), rank,
                  self = *this](const Result<mesh::Replies>& replies) {
      if (!replies) return (void)p->set(std::unexpected(replies.error()));
      auto v = decode<R>((*replies)[0]);
      if (!v) return (void)p->set(std::unexpected(self.error_at(rank, v.error())));
      p->set(std::move(*v));
    });
    return out;
  }
};

template <class A, class... Args>
Result<ActorMesh<A>> ProcMesh::spawn(std::string name, Args&&... args) const {
  using CtorArgs = std::remove_pointer_t<decltype(podium_actor_ctor_args(static_cast<A*>(nullptr)))>;
  auto encoded = [&]<class... P>(detail::TypeList<P...>*) {
    static_assert(sizeof...(P) == sizeof...(Args),
                  "wrong number of constructor arguments (see PODIUM_ACTOR)");
    return detail::pack(std::tuple<std::decay_t<P>...>(std::forward<Args>(args)...));
  }(static_cast<CtorArgs*>(nullptr));
  auto base = spawn_raw(podium_actor_type_name(static_cast<A*>(nullptr)), std::move(name),
                        {std::move(encoded)});
  if (!base) return std::unexpected(base.error());
  return ActorMesh<A>(std::move(*base));
}

}  // namespace podium
