// Proc::serve_gateway (proc.h, DB-8 in python/podium/debugger/endpoint.py): the controller's
// debug address, a TCP gateway listener beside its Unix socket.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "podium/actor/future.h"
#include "podium/actor/message.h"
#include "podium/actor/proc.h"

namespace podium::actor {
namespace {

using namespace std::chrono_literals;

// Replies to "echo" with its argument.
class Echo : public ActorBase {
 public:
  Status handle(wire::Envelope&& msg, Context& cx) override {
    if (cx.call()->endpoint == "echo") cx.reply({Buffer::copy_of(msg.parts[1].view())});
    return ok();
  }
};

struct Reply {
  bool ok;
  std::string value;
  Error error;
};

// Calls endpoint(arg) of `to` from `from` and returns the reply's future.
Future<Reply> call(Proc& from, const ActorId& to, const std::string& endpoint,
                   const std::string& arg) {
  auto promise = std::make_shared<Promise<Reply>>();
  auto port = from.open_port(
      [promise](wire::Envelope&& env) {
        auto h = decode_reply_header(env.parts[0]);
        promise->set(h->ok ? Reply{true, std::string(env.parts[1].view()), {}}
                           : Reply{false, "", h->error});
      },
      true);
  wire::Envelope env;
  env.kind = static_cast<uint8_t>(MessageKind::kCall);
  env.dest = PortId{to, kMailboxPort}.to_string();
  env.headers.emplace_back(kReplyHeader, port.to_string());
  env.parts.push_back(encode_call_header(CallHeader{endpoint, 0, {}, {}}));
  env.parts.push_back(Buffer::copy_of(arg));
  from.send(to.proc.addr, std::move(env));
  return promise->future();
}

class ProcGateway : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("podium-proc-gateway-test-" + std::to_string(::getpid())))
               .string();
    std::filesystem::create_directories(dir_);
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Proc> make(const std::string& name, channel::Config cfg) {
    auto p = Proc::make(ProcConfig{*channel::Address::parse("unix:" + dir_ + "/" + name +
                                                            ".sock"),
                                   cfg});
    EXPECT_TRUE(p) << p.error().to_string();
    return std::move(*p);
  }

  ActorId spawn(Proc& p, const std::string& name) {
    auto id = p.spawn(name, 0, [](Context&) -> Result<std::unique_ptr<ActorBase>> {
      return std::make_unique<Echo>();
    });
    EXPECT_TRUE(id) << id.error().to_string();
    return *id;
  }

  std::string dir_;
};

// DB-8: a proc listening on a Unix socket also serves a TCP gateway (the controller's debug
// address); a client attached there with the job's secret reaches the proc's actors by the
// gateway's address, one with another secret is refused by the channel, and the proc goes
// on serving.
TEST_F(ProcGateway, ServeGatewayLetsAnAttachedClientReachThisProcsActors) {
  channel::Config secure;
  secure.secret = "the-jobs-secret";
  auto server = make("server", secure);
  auto bound = server->serve_gateway(*channel::Address::parse("tcp:127.0.0.1:0"));
  ASSERT_TRUE(bound) << bound.error().to_string();
  EXPECT_NE(bound->port, 0);
  // Again: the same address; another port: refused (one gateway per proc).
  auto again = server->serve_gateway(*channel::Address::parse("tcp:127.0.0.1:0"));
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *bound);
  EXPECT_FALSE(server->serve_gateway(*channel::Address::parse("tcp:127.0.0.1:1")));
  EXPECT_FALSE(server->serve_gateway(*channel::Address::parse("unix:" + dir_ + "/g.sock")));
  ActorId actor = spawn(*server, "debug_controller");
  // The client names the actor by the gateway's address: the proc routes by its name.
  ActorId via_gateway{ProcId{*bound}, actor.name, actor.index};

  auto attach = [&](const std::string& secret) {
    ProcConfig cfg{*bound, {}};
    cfg.channel.secret = secret;
    cfg.via = *bound;
    cfg.channel.via = *bound;
    cfg.via_timeout = 2000ms;
    return Proc::make(cfg);
  };
  auto client = attach("the-jobs-secret");
  ASSERT_TRUE(client) << client.error().to_string();
  auto stranger = attach("another-secret");
  EXPECT_FALSE(stranger);  // the channel refused its setup: no duplex, no routed address
  auto r = call(**client, via_gateway, "echo", "list").get(10s);
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->ok) << r->error.to_string();
  EXPECT_EQ(r->value, "list");
  EXPECT_GE(server->channel_stats().refused_auth, 1u);
  // A proc that attaches through a gateway itself serves none.
  EXPECT_FALSE((*client)->serve_gateway(*channel::Address::parse("tcp:127.0.0.1:0")));
}

}  // namespace
}  // namespace podium::actor
