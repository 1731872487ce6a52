#include "podium/actor/port_receiver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "podium/actor/message.h"
#include "podium/actor/proc.h"

namespace podium::actor {
namespace {

using namespace std::chrono_literals;

class PortReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("podium-port-receiver-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    a_ = make("a");
    b_ = make("b");
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Proc> make(const std::string& name) {
    auto addr = channel::Address::parse("unix:" + (dir_ / (name + ".sock")).string());
    auto p = Proc::make(ProcConfig{*addr, {}});
    EXPECT_TRUE(p) << p.error().to_string();
    return std::move(*p);
  }

  // A kPort message with one part, `value`, from `from` to `port`.
  static void send_port(Proc& from, const std::string& port, const std::string& value) {
    send_to_port(from, port, {Buffer::copy_of(value)});
  }

  static std::string text(const Result<std::vector<Buffer>>& r) {
    if (!r) return "error: " + r.error().message;
    return r->empty() ? std::string() : std::string((*r)[0].view());
  }

  std::filesystem::path dir_;
  std::unique_ptr<Proc> a_, b_;
};

TEST_F(PortReceiverTest, RecvGetsMessagesInArrivalOrderWhetherAskedBeforeOrAfter) {  // PQ-1
  PortReceiver rx(*a_, false);
  auto first = rx.recv();  // asked before anything arrived
  send_port(*b_, rx.port_id(), "one");
  send_port(*b_, rx.port_id(), "two");
  send_port(*b_, rx.port_id(), "three");
  EXPECT_EQ(text(first.get(5s)), "one");
  // Queued until asked for.
  auto r2 = rx.recv().get(5s);
  auto r3 = rx.recv().get(5s);
  EXPECT_EQ(text(r2), "two");
  EXPECT_EQ(text(r3), "three");
}

TEST_F(PortReceiverTest, ARepliesValueOrErrorIsTheMessage) {  // PQ-1
  PortReceiver rx(*a_, false);
  b_->send_reply(rx.port_id(), 3, std::vector<Buffer>{Buffer::copy_of("answer")});
  b_->send_reply(rx.port_id(), 4, std::unexpected(make_error(BaseErrc::kInternal, "refused")));
  EXPECT_EQ(text(rx.recv().get(5s)), "answer");
  auto failed = rx.recv().get(5s);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, static_cast<uint16_t>(BaseErrc::kInternal));
  EXPECT_EQ(failed.error().message, "refused");
}

TEST_F(PortReceiverTest, CloseFailsPendingAndLaterRecvs) {  // PQ-2
  PortReceiver rx(*a_, false);
  auto pending = rx.recv();
  rx.close();
  auto r = pending.get(5s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, static_cast<uint16_t>(ActorErrc::kNoSuchPort));
  EXPECT_NE(r.error().message.find(rx.port_id()), std::string::npos) << r.error().message;
  auto later = rx.recv().get(5s);
  ASSERT_FALSE(later);
  EXPECT_EQ(later.error().code, static_cast<uint16_t>(ActorErrc::kNoSuchPort));
  rx.close();  // idempotent
}

TEST_F(PortReceiverTest, AOnceReceiverHandsOutItsOneMessage) {  // PQ-2
  PortReceiver rx(*a_, true);
  send_port(*b_, rx.port_id(), "only");
  EXPECT_EQ(text(rx.recv().get(5s)), "only");
}

}  // namespace
}  // namespace podium::actor
