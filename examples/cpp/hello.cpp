// hello: spawn 4 procs on this host, an actor mesh on them, and call it.
//
// The same binary is the controller and, re-entered by podium::init(), every proc.
#include <cstdio>
#include <string>
#include <unistd.h>

#include "podium/mesh/actor_mesh.h"

class Greeter : public podium::Actor {
 public:
  explicit Greeter(std::string greeting) : greeting_(std::move(greeting)) {}

  std::string greet(const std::string& who) {
    ++calls_;
    return greeting_ + ", " + who + ", from rank " + std::to_string(rank()) + " (pid " +
           std::to_string(::getpid()) + ")";
  }
  int calls() { return calls_; }

  PODIUM_ENDPOINTS(Greeter, greet, calls)

 private:
  std::string greeting_;
  int calls_ = 0;
};
PODIUM_ACTOR(Greeter, std::string)

template <class T>
T or_die(podium::Result<T> r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "hello: %s: %s\n", what, r.error().to_string().c_str());
    std::exit(1);
  }
  return std::move(*r);
}

int main(int argc, char** argv) {
  podium::init(argc, argv);  // in a spawned proc, this serves actors and never returns

  auto procs = or_die(podium::this_host().spawn_procs({{"procs", 4}}), "spawn_procs");
  auto greeters = or_die(procs.spawn<Greeter>("greeter", std::string("hello")), "spawn");
  if (auto init = greeters.initialized().get(std::chrono::seconds(10)); !init) {
    std::fprintf(stderr, "hello: actors did not start: %s\n", init.error().to_string().c_str());
    return 1;
  }
  std::printf("spawned %zu greeters over %s\n", greeters.size(),
              greeters.extent().to_string().c_str());

  // call: every actor answers; the result is a ValueMesh in rank order.
  auto all = or_die(greeters.call(&Greeter::greet, std::string("world")).get(std::chrono::seconds(10)),
                    "call");
  for (const auto& [point, text] : all.items()) {
    std::printf("  %s -> %s\n", point.to_string().c_str(), text.c_str());
  }

  // A slice keeps a range of a dimension; call_one needs a mesh of exactly one actor.
  auto evens = or_die(greeters.slice("procs", podium::ndslice::Range{0, 4, 2}), "slice");
  auto even_calls = or_die(evens.call(&Greeter::greet, std::string("evens")).get(std::chrono::seconds(10)),
                           "call on a slice");
  std::printf("slice procs=0:4:2 has %zu actors:\n", even_calls.size());
  for (const auto& text : even_calls.values()) std::printf("  %s\n", text.c_str());

  auto third = or_die(greeters.slice("procs", 2), "slice");
  auto one = or_die(third.call_one(&Greeter::greet, std::string("rank two")).get(std::chrono::seconds(10)),
                    "call_one");
  std::printf("call_one on procs=2: %s\n", one.c_str());

  auto counts = or_die(greeters.call(&Greeter::calls).get(std::chrono::seconds(10)), "call");
  std::printf("calls per actor:");
  for (int c : counts.values()) std::printf(" %d", c);
  std::printf("\n");

  // call_one on a mesh of several actors is refused at the call site.
  auto refused = greeters.call_one(&Greeter::calls).get(std::chrono::seconds(1));
  std::printf("call_one on 4 actors: %s\n", refused ? "unexpectedly accepted"
                                                    : refused.error().message.c_str());

  if (auto st = procs.stop().get(std::chrono::seconds(10)); !st) {
    std::fprintf(stderr, "hello: stop: %s\n", st.error().to_string().c_str());
    return 1;
  }
  std::printf("procs stopped\n");
  podium::shutdown();
  return 0;
}
