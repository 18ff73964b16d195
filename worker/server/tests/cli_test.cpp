#include <gtest/gtest.h>

#include "server/cli.h"

namespace worker::server {
namespace {

CliOptions parse(std::vector<std::string> a) {
  return parse_cli(a);
}

// REQ: WRK-D13 M0-W-1100 M0-W-1101
TEST(ServerCli, DefaultsMatchD13) {
  const auto o = parse({"--model", "/m.gguf"});
  EXPECT_EQ(o.model, "/m.gguf");
  EXPECT_EQ(o.port, 8080);
  EXPECT_EQ(o.bind, "127.0.0.1");
  EXPECT_EQ(o.gpu_device, 0);
  EXPECT_EQ(o.backend, "cuda");
  EXPECT_EQ(o.queue_depth, 16u);
  EXPECT_EQ(o.inference_timeout_sec, 300);
  EXPECT_TRUE(o.worker_id_generated);
  EXPECT_TRUE(is_valid_uuid(o.worker_id));
  EXPECT_EQ(o.worker_id[14], '4');                                          // version 4
  EXPECT_NE(std::string("89ab").find(o.worker_id[19]), std::string::npos);  // RFC 4122 variant
}

// REQ: WRK-D13 M0-W-1100
TEST(ServerCli, AllOptionsParse) {
  const auto o = parse({"--model=/m.gguf",
                        "--port",
                        "9000",
                        "--bind",
                        "127.0.0.1",
                        "--gpu",
                        "1",
                        "--worker-id",
                        "123e4567-e89b-12d3-a456-426614174000",
                        "--backend",
                        "cpu",
                        "--ctx-size",
                        "1024",
                        "--queue-depth",
                        "1",
                        "--inference-timeout-sec",
                        "5",
                        "--api-key",
                        "k",
                        "--tokenizer",
                        "/t.json",
                        "--log-logits",
                        "/l.jsonl",
                        "--callback-url",
                        "http://127.0.0.1:1/ready"});
  EXPECT_EQ(o.port, 9000);
  EXPECT_EQ(o.bind, "127.0.0.1");
  EXPECT_EQ(o.gpu_device, 1);
  EXPECT_EQ(o.worker_id, "123e4567-e89b-12d3-a456-426614174000");
  EXPECT_FALSE(o.worker_id_generated);
  EXPECT_EQ(o.backend, "cpu");
  EXPECT_EQ(o.ctx_size, 1024);
  EXPECT_EQ(o.queue_depth, 1u);
  EXPECT_EQ(o.inference_timeout_sec, 5);
  EXPECT_EQ(o.api_key, "k");
  EXPECT_EQ(o.tokenizer, "/t.json");
  EXPECT_EQ(o.log_logits, "/l.jsonl");
  EXPECT_EQ(o.callback_url, "http://127.0.0.1:1/ready");
  EXPECT_EQ(parse({"--model", "m", "--gpu-device", "2"}).gpu_device, 2);
  EXPECT_EQ(parse({"--model", "m"}).numerics, "exact");
  EXPECT_EQ(parse({"--model", "m", "--numerics", "fast"}).numerics, "fast");
  EXPECT_EQ(parse({"--model", "m", "--numerics=exact"}).numerics, "exact");
}

// REQ: WRK-D13 M0-W-1100 M0-W-1111 WRK-D4
TEST(ServerCli, BadValuesAreRejected) {
  EXPECT_THROW(parse({}), std::invalid_argument);  // --model required
  EXPECT_THROW(parse({"--model", "m", "--port", "0"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--port", "1023"}), std::invalid_argument);  // M0-W-1100
  EXPECT_THROW(parse({"--model", "m", "--port", "65536"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--port", "80x"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--worker-id", "not-a-uuid"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--backend", "auto"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--numerics", "approximate"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--frobnicate"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--queue-depth", "-3"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--ctx-size", "abc"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--inference-timeout-sec", "0"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--inference-timeout-sec", "1s"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--inference-timeout-sec", "nan"}), std::invalid_argument);
  EXPECT_DOUBLE_EQ(parse({"--model", "m", "--inference-timeout-sec", "0.25"}).inference_timeout_sec,
                   0.25);
  EXPECT_THROW(parse({"--model", "m", "--gpu-device", "-1"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--port"}), std::invalid_argument);
  EXPECT_THROW(parse({"--model", "m", "--callback-url", "ftp://x"}), std::invalid_argument);
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_EQ(parse({"--model", "m", "--port", "1024"}).port, 1024);
  EXPECT_EQ(parse({"--model", "m", "--port", "65535"}).port, 65535);
}

// REQ: M0-W-1100
TEST(ServerCli, UuidValidation) {
  EXPECT_TRUE(is_valid_uuid("123e4567-e89b-12d3-a456-426614174000"));
  EXPECT_TRUE(is_valid_uuid("123E4567-E89B-12D3-A456-426614174000"));
  EXPECT_FALSE(is_valid_uuid("123e4567e89b12d3a456426614174000"));
  EXPECT_FALSE(is_valid_uuid("123e4567-e89b-12d3-a456-42661417400g"));
  EXPECT_NE(generate_uuid_v4(), generate_uuid_v4());
}

}  // namespace
}  // namespace worker::server
