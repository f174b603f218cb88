#include "master/segment_manager.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc::master {
namespace {

TEST(SegmentManager, ReplicasGoToDistinctClients) {
  SegmentManager sm(64);
  for (const char* c : {"a", "b", "c", "d"}) sm.AddSegment(c, std::string(c) + ":1", 1 << 20);
  for (uint32_t n = 1; n <= 4; ++n) {
    auto placed = sm.Place(1000, n, "");
    ASSERT_TRUE(placed.ok()) << placed.status();
    ASSERT_EQ(placed->size(), n);
    std::set<std::string> clients;
    for (const auto& loc : *placed) {
      clients.insert(loc.client_id);
      EXPECT_EQ(loc.length, 1000u);
      EXPECT_EQ(loc.endpoint, loc.client_id + ":1");
    }
    EXPECT_EQ(clients.size(), n) << "two replicas on one client";
  }
}

TEST(SegmentManager, PreferredClientComesFirst) {
  SegmentManager sm(64);
  sm.AddSegment("big", "big:1", 1 << 24);
  sm.AddSegment("small", "small:1", 1 << 16);
  auto placed = sm.Place(1000, 2, "small");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)[0].client_id, "small");
  EXPECT_EQ((*placed)[1].client_id, "big");
  auto one = sm.Place(1000, 1, "small");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0].client_id, "small");
}

TEST(SegmentManager, FullPreferredClientFallsBackToOthers) {
  SegmentManager sm(64);
  sm.AddSegment("me", "me:1", 1024);
  sm.AddSegment("other", "other:1", 1 << 20);
  ASSERT_TRUE(sm.Place(1024, 1, "me").ok());
  auto placed = sm.Place(1000, 1, "me");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)[0].client_id, "other");
}

TEST(SegmentManager, WithoutPreferenceMostFreeClientIsChosen) {
  SegmentManager sm(64);
  sm.AddSegment("a", "a:1", 1 << 16);
  sm.AddSegment("b", "b:1", 1 << 20);
  auto placed = sm.Place(64, 1, "");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)[0].client_id, "b");
}

TEST(SegmentManager, FewerClientsThanReplicasIsNoSpace) {
  SegmentManager sm(64);
  sm.AddSegment("a", "a:1", 1 << 20);
  sm.AddSegment("a", "a:1", 1 << 20);  // two segments, still one client
  sm.AddSegment("b", "b:1", 1 << 20);
  auto placed = sm.Place(64, 3, "a");
  EXPECT_EQ(ToCode(placed.status()), Code::kNoSpace);
  EXPECT_EQ(sm.Stats().used, 0u);
  EXPECT_EQ(ToCode(sm.CouldEverPlace(64, 3)), Code::kNoSpace);  // two clients, not three
}

TEST(SegmentManager, CouldEverPlaceCountsClientsWithASegmentLargeEnough) {
  SegmentManager sm(64);
  sm.AddSegment("a", "a:1", 1 << 20);
  sm.AddSegment("a", "a:2", 1 << 20);  // two 1 MiB segments do not hold 2 MiB
  sm.AddSegment("b", "b:1", 4 << 20);
  // Full or empty does not matter: the question is whether eviction could ever make room.
  ASSERT_TRUE(sm.Place(4 << 20, 1, "b").ok());
  EXPECT_TRUE(sm.CouldEverPlace(1 << 20, 2).ok());
  EXPECT_TRUE(sm.CouldEverPlace(2 << 20, 1).ok());
  EXPECT_TRUE(sm.CouldEverPlace(4 << 20, 1).ok());
  EXPECT_EQ(ToCode(sm.CouldEverPlace(2 << 20, 2)), Code::kNoSpace);
  EXPECT_EQ(ToCode(sm.CouldEverPlace((4 << 20) + 1, 1)), Code::kNoSpace);  // rounds past 4 MiB
  EXPECT_EQ(ToCode(sm.CouldEverPlace(64, 3)), Code::kNoSpace);              // two clients
  EXPECT_EQ(ToCode(sm.CouldEverPlace(UINT64_MAX, 1)), Code::kNoSpace);      // no overflow
  absl::Status s = sm.CouldEverPlace(5 << 20, 1);
  EXPECT_NE(s.message().find("0 of 2 client(s)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("largest segment 4194304 bytes"), std::string::npos) << s;
}

TEST(SegmentManager, FailedPlacementRollsBackPartialAllocations) {
  SegmentManager sm(64);
  sm.AddSegment("a", "a:1", 1 << 20);
  sm.AddSegment("b", "b:1", 1 << 20);
  sm.AddSegment("c", "c:1", 1024);  // too small for the object
  auto placed = sm.Place(4096, 3, "a");
  EXPECT_EQ(ToCode(placed.status()), Code::kNoSpace);
  EXPECT_EQ(sm.Stats().used, 0u);
  EXPECT_EQ(sm.ClientStats("a").used, 0u);
  EXPECT_EQ(sm.ClientStats("b").used, 0u);
  // Everything is still allocatable: the rollback freed the ranges for real.
  EXPECT_TRUE(sm.Place(1 << 20, 2, "").ok());
  EXPECT_EQ(sm.Stats().used, 2u << 20);
}

TEST(SegmentManager, FragmentationNeverFailsAPutWhileOneFreeRangeFits) {
  SegmentManager sm(64);
  sm.AddSegment("a", "a:1", 64 * 64);
  std::vector<MemoryLocation> locs;
  for (int i = 0; i < 64; ++i) locs.push_back((*sm.Place(64, 1, ""))[0]);
  EXPECT_FALSE(sm.Place(1, 1, "").ok());
  for (int i = 0; i < 64; i += 2) sm.Free(locs[i]);  // 32 holes of 64 bytes
  EXPECT_EQ(sm.LargestFree(), 64u);
  EXPECT_EQ(ToCode(sm.Place(65, 1, "").status()), Code::kNoSpace);
  sm.Free(locs[9]);  // holes 8,9,10 join: 192 bytes
  EXPECT_EQ(sm.LargestFree(), 192u);
  auto placed = sm.Place(192, 1, "");
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ((*placed)[0].offset, locs[8].offset);
  // The 30 remaining holes of 64 bytes still serve 64-byte puts.
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(sm.Place(64, 1, "").ok()) << i;
  EXPECT_FALSE(sm.Place(64, 1, "").ok());
}

TEST(SegmentManager, PicksTheSegmentWhereTheObjectFitsAcrossSegments) {
  SegmentManager sm(64);
  uint64_t s1 = sm.AddSegment("a", "a:1", 4096);
  uint64_t s2 = sm.AddSegment("a", "a:1", 1 << 20);
  auto big = sm.Place(100'000, 1, "a");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)[0].segment_id, s2);
  // Fill s2 completely; a small object goes to s1.
  ASSERT_TRUE(sm.Place((1 << 20) - 100'032, 1, "a").ok());
  auto small = sm.Place(64, 1, "a");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)[0].segment_id, s1);
}

TEST(SegmentManager, StatsTrackAllocationsAndRemovedClients) {
  SegmentManager sm(64);
  sm.AddSegment("a", "a:1", 1 << 20);
  sm.AddSegment("b", "b:1", 1 << 20);
  auto p = sm.Place(100, 2, "");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(sm.Stats().used, 256u);  // two replicas rounded to 128
  EXPECT_EQ(sm.Stats().capacity, 2u << 20);
  EXPECT_EQ(sm.RemoveClient("a"), 1u);
  EXPECT_EQ(sm.Stats().used, 128u);
  EXPECT_EQ(sm.Stats().capacity, 1u << 20);
  // Freeing a location on the removed segment is a no-op.
  for (const auto& loc : *p) sm.Free(loc);
  EXPECT_EQ(sm.Stats().used, 0u);
  EXPECT_EQ(sm.RemoveClient("a"), 0u);
}

TEST(SegmentManager, SegmentIdsAreNeverReused) {
  SegmentManager sm(64);
  std::set<uint64_t> ids;
  for (int i = 0; i < 10; ++i) {
    ids.insert(sm.AddSegment("a", "a:1", 4096));
    sm.RemoveClient("a");
  }
  EXPECT_EQ(ids.size(), 10u);
}

// The free-space index against a brute-force reference: after random placements, frees, new
// segments and removed clients, every single-replica placement (sizes small enough that
// fragmentation never matters) lands on a client with the most free bytes, and the totals agree.
TEST(SegmentManager, FreeSpaceIndexPicksTheClientWithMostFreeBytes) {
  SegmentManager sm(64);
  std::mt19937_64 rng(7);
  std::vector<std::string> clients;
  for (int c = 0; c < 12; ++c) {
    clients.push_back("c" + std::to_string(c));
    for (int k = 0; k <= c % 3; ++k) sm.AddSegment(clients.back(), "e", 64 << 10);
  }
  std::vector<MemoryLocation> live;
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      uint64_t most = 0;
      for (const auto& c : clients) {
        SegmentStats st = sm.ClientStats(c);
        most = std::max(most, st.capacity - st.used);
      }
      auto placed = sm.Place(64, 1, "");
      if (most < 64) {
        EXPECT_FALSE(placed.ok());
        continue;
      }
      ASSERT_TRUE(placed.ok()) << placed.status();
      SegmentStats st = sm.ClientStats((*placed)[0].client_id);
      EXPECT_EQ(st.capacity - st.used + 64, most) << "step " << step;
      live.push_back((*placed)[0]);
    } else if (op < 9 && !live.empty()) {
      const size_t i = rng() % live.size();
      sm.Free(live[i]);
      live[i] = live.back();
      live.pop_back();
    } else if (rng() % 2 == 0) {
      sm.AddSegment(clients[rng() % clients.size()], "e", 64 << 10);
    } else {
      const std::string victim = clients[rng() % clients.size()];
      sm.RemoveClient(victim);
      std::erase_if(live, [&](const MemoryLocation& l) { return l.client_id == victim; });
      sm.AddSegment(victim, "e", 64 << 10);  // back, empty
    }
  }
  uint64_t used = 0, capacity = 0;
  for (const auto& c : clients) {
    used += sm.ClientStats(c).used;
    capacity += sm.ClientStats(c).capacity;
  }
  EXPECT_EQ(sm.Stats().used, used);
  EXPECT_EQ(sm.Stats().capacity, capacity);
  EXPECT_EQ(used, live.size() * 64);
}

// Thousands of full segments (junk registrations, or a cluster whose memory is full elsewhere)
// do not stand between a put and the one client with room, and replicas still go to distinct
// clients in order of free space.
TEST(SegmentManager, FullSegmentsAreNotInTheWay) {
  SegmentManager sm(64);
  for (int c = 0; c < 200; ++c) {
    const std::string id = "junk" + std::to_string(c);
    for (int k = 0; k < 16; ++k) {
      sm.AddSegment(id, "j", 4096);
      ASSERT_TRUE(sm.Place(4096, 1, id).ok());  // fill it
    }
  }
  sm.AddSegment("roomy", "r", 1 << 20);
  sm.AddSegment("roomier", "r2", 2 << 20);
  auto placed = sm.Place(8192, 2, "junk3");
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ((*placed)[0].client_id, "roomier");
  EXPECT_EQ((*placed)[1].client_id, "roomy");
  EXPECT_FALSE(sm.Place(8192, 3, "").ok());
  EXPECT_EQ(sm.Stats().used, 200u * 16 * 4096 + 2 * 8192);
}

TEST(SegmentManager, SegmentIdsCarryTheEpochAndACounterFromOne) {
  SegmentManager sm(SegmentManagerOptions{.epoch = 0xabcd1234});
  EXPECT_EQ(sm.AddSegment("a", "a:1", 1 << 20), 0xabcd123400000001u);
  auto ids = sm.AddClientSegments("b", "b:1", {1 << 20, 1 << 20}, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<uint64_t>{0xabcd123400000002u, 0xabcd123400000003u}));
  sm.RemoveClient("a");
  EXPECT_EQ(sm.AddSegment("a", "a:1", 1 << 20), 0xabcd123400000004u) << "never reused";
}

TEST(SegmentManager, ARegistrationThatWouldExhaustTheCounterIsRefusedWhole) {
  SegmentManager sm(
      SegmentManagerOptions{.epoch = 7, .first_segment_counter = kSegmentCounterLimit - 2});
  auto refused = sm.AddClientSegments("a", "a:1", {1 << 20, 1 << 20, 1 << 20}, false);
  EXPECT_EQ(ToCode(refused.status()), Code::kInternal);
  EXPECT_EQ(sm.Stats().segments, 0u) << "nothing added";
  auto ids = sm.AddClientSegments("a", "a:1", {1 << 20, 1 << 20}, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->back(), (7ull << 32) | (kSegmentCounterLimit - 1));
  EXPECT_FALSE(sm.AddClientSegments("b", "b:1", {1 << 20}, false).ok());
  EXPECT_EQ(sm.AddSegment("b", "b:1", 1 << 20), 0u);
  EXPECT_TRUE(sm.AddClientSegments("b", "b:1", {}, false).ok()) << "no segment, no id needed";
}

TEST(SegmentManager, HeldClientsGetNoPlacementUntilReleased) {
  SegmentManager sm(64);
  ASSERT_TRUE(sm.AddClientSegments("held", "h:1", {4 << 20}, true).ok());
  sm.AddSegment("open", "o:1", 1 << 20);
  EXPECT_TRUE(sm.IsHeld("held"));
  for (int i = 0; i < 4; ++i) {
    auto p = sm.Place(4096, 1, "held");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)[0].client_id, "open") << "not even as the preferred client";
  }
  EXPECT_FALSE(sm.Place(4096, 2, "").ok()) << "one client open to placement";
  bool wait = false;
  EXPECT_FALSE(sm.CouldEverPlace(2 << 20, 1, &wait).ok());
  EXPECT_TRUE(wait) << "only the held client has a segment that large";
  wait = false;
  EXPECT_FALSE(sm.CouldEverPlace(8 << 20, 1, &wait).ok());
  EXPECT_FALSE(wait) << "no client could ever hold it";
  // Reserved ranges in held segments keep the free-space index right across the release.
  std::vector<MemoryLocation> ranges{{"", "", 1, 0, 1 << 20}};
  ASSERT_TRUE(sm.AllocateAt("held", ranges)[0].ok());
  EXPECT_EQ(ranges[0].endpoint, "h:1");
  EXPECT_EQ(sm.ClientStats("held").used, 1u << 20);
  EXPECT_TRUE(sm.Release("held"));
  EXPECT_FALSE(sm.Release("held")) << "released once";
  auto p = sm.Place(3 << 20, 1, "");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0].client_id, "held");
  EXPECT_EQ((*p)[0].offset, 1u << 20) << "after the reserved range";
  EXPECT_EQ(sm.Stats().used, sm.ClientStats("held").used + sm.ClientStats("open").used);
  // Held segments added to a client open to placement hold the whole client.
  sm.Free((*p)[0]);
  ASSERT_TRUE(sm.AddClientSegments("open", "o:1", {1 << 20}, true).ok());
  EXPECT_TRUE(sm.IsHeld("open"));
  auto only = sm.Place(4096, 1, "open");
  ASSERT_TRUE(only.ok());
  EXPECT_EQ((*only)[0].client_id, "held");
  EXPECT_FALSE(sm.Place(4096, 2, "").ok());
}

TEST(SegmentManager, AllocateAtRefusesForeignSegmentsAndOverlaps) {
  SegmentManager sm(64);
  const uint64_t mine = sm.AddSegment("me", "me:1", 1 << 20);
  const uint64_t theirs = sm.AddSegment("them", "them:1", 1 << 20);
  std::vector<MemoryLocation> ranges{{"", "", theirs, 0, 100}, {"", "", mine, 0, 100},
                                     {"", "", mine, 64, 64},   {"", "", mine, 4, 64},
                                     {"", "", 999, 0, 64},     {"", "", mine, (1 << 20) - 64, 128},
                                     {"", "", mine, 128, 64}};
  std::vector<absl::Status> out = sm.AllocateAt("me", ranges);
  std::vector<Code> codes;
  for (const auto& s : out) codes.push_back(ToCode(s));
  EXPECT_EQ(codes, (std::vector<Code>{Code::kInvalidArgument, Code::kOk, Code::kInvalidArgument,
                                      Code::kInvalidArgument, Code::kInvalidArgument,
                                      Code::kInvalidArgument, Code::kOk}));
  EXPECT_EQ(sm.ClientStats("me").used, 128u + 64);
  EXPECT_EQ(sm.ClientStats("them").used, 0u);
}

TEST(SegmentManager, FreedRangesQueueForTheirOwnerBoundedOldestDropped) {
  MetricsRegistry metrics;
  Counter& dropped = metrics.GetCounter("dropped", "");
  SegmentManager sm(SegmentManagerOptions{.forget_queue_limit = 3, .forget_dropped = &dropped});
  sm.AddSegment("a", "a:1", 1 << 20);
  sm.AddSegment("b", "b:1", 1 << 20);
  std::vector<MemoryLocation> placed;
  for (int i = 0; i < 5; ++i) {
    auto p = sm.Place(4096, 1, "a");
    ASSERT_TRUE(p.ok());
    placed.push_back((*p)[0]);
  }
  EXPECT_FALSE(sm.Place(1 << 20, 2, "").ok()) << "its rollback on b queues nothing";
  for (const auto& loc : placed) sm.Free(loc);
  sm.Free(placed[0]);  // twice: nothing freed, nothing queued
  EXPECT_EQ(dropped.Value(), 2u);
  bool more = false;
  std::vector<ReplicaRef> got = sm.TakeForgotten("a", 2, &more);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(more);
  EXPECT_EQ(got[0], (ReplicaRef{placed[2].segment_id, placed[2].offset})) << "oldest kept first";
  EXPECT_EQ(got[1], (ReplicaRef{placed[3].segment_id, placed[3].offset}));
  got = sm.TakeForgotten("a", 2, &more);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(more);
  EXPECT_TRUE(sm.TakeForgotten("b", 10, &more).empty());
  // The queue goes with the client's segments.
  auto p = sm.Place(4096, 1, "a");
  ASSERT_TRUE(p.ok());
  sm.Free((*p)[0]);
  sm.RemoveClient("a");
  sm.AddSegment("a", "a:2", 1 << 20);
  EXPECT_TRUE(sm.TakeForgotten("a", 10, &more).empty());
  EXPECT_FALSE(more);
}

}  // namespace
}  // namespace mc::master
