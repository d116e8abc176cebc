// The Redis client on its own (store/redis_client.h): a PING through a pipeline, an unreachable
// server as a logged miss, and the throwaway server the tier benchmark starts.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>

#include "store/redis_client.h"
#include "support/chunk_fixtures.h"

namespace ct::store {
namespace {

TEST(RedisClient, AnUnreachableServerIsAMissNotAnError) {
  EXPECT_FALSE(redis_ping("127.0.0.1", 1));
  RedisClientOptions o;
  o.port = 1;  // nothing listens on port 1
  RedisClient c(o);
  EXPECT_FALSE(c.exchange(0, {{"PING"}}).has_value());
  EXPECT_EQ(c.failed_exchanges(), 1u);
  EXPECT_EQ(c.address(), "127.0.0.1:1");
}

TEST(RedisClient, PipelinesAgainstALocalServer) {
  if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not on PATH";
  test::TempDir dir;
  std::string why;
  auto srv = LocalRedisServer::start(dir.path(), &why);
  ASSERT_TRUE(srv) << why;
  EXPECT_TRUE(redis_ping("127.0.0.1", srv->port()));
  RedisClientOptions o;
  o.port = srv->port();
  RedisClient c(o);
  const std::string key = "ct-client-test:{k}";
  auto r = c.exchange(redis_key_slot(key), {{"SET", key, "v"}, {"GET", key}, {"DEL", key}});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(std::string((*r)[1]->str, (*r)[1]->len), "v");
  EXPECT_EQ(c.failed_exchanges(), 0u);
  const int port = srv->port();
  srv.reset();  // killed: the next exchange is a miss
  EXPECT_FALSE(redis_ping("127.0.0.1", port));
}

}  // namespace
}  // namespace ct::store
