// BatchGetter's speculative local copies: the owner-side index (fed by the putter's index
// notices, as in the daemon) places keys in this daemon's segments; a get copies them during the
// lookup and keeps a copy only when the answer proves it (same replica, generation, lease,
// checksum). Every other case is read again from the answer: every destination byte is checked,
// and the leases are counted back to zero.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/batch/batch_get.h"
#include "client/session/index_service.h"
#include "client/session/object_index.h"
#include "gtest/gtest.h"
#include "tests/fakes/await.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client::testing {
namespace {

class BatchGetSpeculation : public ClientFixture {
 protected:
  void SetUp() override {
    ClientFixture::SetUp();
    std::vector<uint64_t> sizes;
    for (const auto& b : local_->backing) sizes.push_back(b.size());
    index_ = std::make_unique<ObjectIndex>(sizes);
    resolve_ = [this](uint64_t id) -> std::optional<size_t> {
      for (size_t i = 0; i < local_->ids.size(); ++i) {
        if (local_->ids[i] == id) return i;
      }
      return std::nullopt;
    };
    notifier_ =
        std::make_unique<IndexNotifier>(kLocalEndpoint, index_.get(), resolve_, engine_, registry_);
    putter_.SetIndexNotifier(notifier_.get());
    SpeculationSource source{.index = index_.get(), .segments = {}, .resolve = resolve_};
    for (auto& b : local_->backing) source.segments.push_back({b.data(), b.size()});
    getter_.SetSpeculation(std::move(source));
    // The answer waits for the speculative copies (they would otherwise race the in-process
    // master and often be late, read as usual).
    master_.SetAfterGetReplicas([this](v1::GetReplicasResponse*) {
      EXPECT_TRUE(WaitFor([this] { return !getter_.SpeculationBusy(); }));
    });
  }

  // testing::GetAndCheck through this fixture's getter.
  std::vector<GetItemResult> GetAndCheck(const std::vector<std::string>& keys,
                                         const std::vector<std::string>& payloads) {
    return ::mc::client::testing::GetAndCheck(getter_, master_, keys, payloads);
  }

  uint64_t Kept() const { return metrics_.get_speculative_kept.Value(); }
  uint64_t Redone() const { return metrics_.get_speculative_redone.Value(); }

  // Puts 16 values of 64 KiB under `prefix`-0..15 (payload seeds from `seed`) into *keys and
  // *payloads.
  void Put16(const std::string& prefix, int seed, std::vector<std::string>* keys,
             std::vector<std::string>* payloads) {
    for (int k = 0; k < 16; ++k) {
      keys->push_back(prefix + std::to_string(k));
      payloads->push_back(Payload(64 << 10, seed + k));
    }
    for (const auto& s : Put(*keys, *payloads)) ASSERT_TRUE(s.ok()) << s;
  }

  // The index entry of `key` (it must have one).
  ObjectIndex::Entry Entry(const std::string& key) {
    std::optional<ObjectIndex::Entry> e = index_->Find(key);
    EXPECT_TRUE(e.has_value()) << key;
    return e.value_or(ObjectIndex::Entry{});
  }

  std::unique_ptr<ObjectIndex> index_;
  SegmentResolver resolve_;
  std::unique_ptr<IndexNotifier> notifier_;
};

TEST_F(BatchGetSpeculation, KeptWhenTheAnswerNamesTheCopiedReplica) {
  std::vector<std::string> keys, payloads;
  ASSERT_NO_FATAL_FAILURE(Put16("spec-", 500, &keys, &payloads));
  ASSERT_EQ(index_->size(), keys.size()) << "the putter records its own replicas";
  for (int round = 0; round < 3; ++round) {
    for (const auto& r : GetAndCheck(keys, payloads)) EXPECT_TRUE(r.status.ok()) << r.status;
  }
  EXPECT_EQ(Kept(), 3 * keys.size());
  EXPECT_EQ(Redone(), 0u);
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 0u);
}

TEST_F(BatchGetSpeculation, AnAnswerBeforeTheHelperStartsIsCopiedByTheGet) {
  // The helper takes no job: the answer comes first, and the get's own thread copies every
  // item from the range the answer proved (counted late, kept only under the same checks).
  std::vector<std::string> keys, payloads;
  ASSERT_NO_FATAL_FAILURE(Put16("late-", 700, &keys, &payloads));
  master_.SetAfterGetReplicas(nullptr);
  getter_.PauseSpeculationForTest(true);
  for (const auto& r : GetAndCheck(keys, payloads)) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(metrics_.get_speculative_late.Value(), keys.size());
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Redone(), 0u);
  EXPECT_FALSE(getter_.SpeculationBusy()) << "the job was taken back from the paused helper";
  // A copy the answer does not prove is not made after it either: read again from the answer.
  ObjectIndex::Entry e = Entry(keys[0]);
  e.object.generation += 1000;
  ASSERT_TRUE(index_->Insert(e.local_index, e.offset, e.object).ok());
  for (const auto& r : GetAndCheck(keys, payloads)) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(metrics_.get_speculative_late.Value(), 2 * keys.size() - 1);
  EXPECT_EQ(Redone(), 1u);
  getter_.PauseSpeculationForTest(false);
  for (const auto& r : GetAndCheck(keys, payloads)) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(Kept() + metrics_.get_speculative_late.Value() + Redone(), 3 * keys.size());
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 0u);
}

TEST_F(BatchGetSpeculation, RedoneWhenTheAnswerNamesAnotherGeneration) {
  const std::string k = "gen", pk = Payload(10'000, 1);
  PutOk(k, pk);
  ObjectIndex::Entry e = Entry(k);
  e.object.generation += 1000;  // as if the index had seen another object there
  ASSERT_TRUE(index_->Insert(e.local_index, e.offset, e.object).ok());
  auto res = GetAndCheck({k}, {pk});
  EXPECT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Redone(), 1u);
}

TEST_F(BatchGetSpeculation, RedoneWhenTheAnswerNamesAnotherRange) {
  // The index places `a` where `b` lives (same size, a stale hint): the copy lands b's bytes,
  // the answer names a's own range, so the item is read again and holds a's payload.
  const std::string a = "a", b = "b", pa = Payload(8192, 2), pb = Payload(8192, 3);
  for (const auto& s : Put({a, b}, {pa, pb})) ASSERT_TRUE(s.ok()) << s;
  ObjectIndex::Entry ea = Entry(a), eb = Entry(b);
  ASSERT_TRUE(ea.local_index != eb.local_index || ea.offset != eb.offset);
  ea.local_index = eb.local_index;
  ea.offset = eb.offset;
  ASSERT_TRUE(index_->Insert(ea.local_index, ea.offset, ea.object).ok());  // replaces b's entry
  auto res = GetAndCheck({a}, {pa});
  EXPECT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Redone(), 1u);
}

TEST_F(BatchGetSpeculation, RedoneWhenTheKeyIsGoneAndNothingIsLeased) {
  const std::string k = "gone", kept = "kept", pk = Payload(4096, 4), pkept = Payload(4096, 5);
  for (const auto& s : Put({k, kept}, {pk, pkept})) ASSERT_TRUE(s.ok()) << s;
  v1::RemoveRequest rm;
  rm.add_keys(k);
  v1::RemoveResponse rm_resp;
  ASSERT_TRUE(master_.Remove(rm, &rm_resp).ok());
  ASSERT_TRUE(index_->Find(k).has_value()) << "the index learns of removals later";
  auto res = GetAndCheck({k, kept}, {pk, pkept});
  EXPECT_EQ(CodeOf(res[0].status), Code::kNotFound);
  EXPECT_EQ(res[0].bytes_written, 0u) << "a miss is never reported written";
  EXPECT_TRUE(res[1].status.ok()) << res[1].status;
  EXPECT_EQ(Kept(), 1u);
  EXPECT_EQ(Redone(), 1u);
}

TEST_F(BatchGetSpeculation, ChecksumMismatchIsReadAgainFromTheAnswer) {
  // Corrupted after indexing: the copy does not hash to the master's checksum. The item is read
  // again: the remote replica serves it; the local one is found corrupt as without speculation.
  StartRemote();
  const std::string k = "corrupt", pk = Payload(50'000, 6);
  PutOk(k, pk, /*replicas=*/2);
  ASSERT_TRUE(index_->Find(k).has_value());
  ASSERT_TRUE(Scribble(k, *local_, 777));
  auto res = GetAndCheck({k}, {pk});
  EXPECT_TRUE(res[0].status.ok()) << res[0].status;
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Redone(), 1u);
  EXPECT_GE(metrics_.checksum_mismatches.Value(), 1u) << "the redone read found the replica bad";

  // With the only replica corrupt, the item fails: never OK with unverified bytes.
  const std::string only = "only", ponly = Payload(3000, 7);
  PutOk(only, ponly);
  ASSERT_TRUE(Scribble(only, *local_, 5));
  res = GetAndCheck({only}, {ponly});
  EXPECT_EQ(CodeOf(res[0].status), Code::kChecksumMismatch) << res[0].status;
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Redone(), 2u);
}

TEST_F(BatchGetSpeculation, InlineAndDuplicateItemsAreServedAsBefore) {
  const std::string k = "dup", pk = Payload(20'000, 8);
  PutOk(k, pk);
  DestArena arena(2 * pk.size());
  std::vector<GetRequestItem> items;
  items.push_back(InlineItem(k));  // the key's first item is inline: no speculation
  items.push_back(SliceItem(k, arena.Slices(0, pk.size())));
  StringSink sink(items.size());
  auto res = getter_.Get(items, 0, &sink);
  for (const auto& r : res) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(sink.data(0), pk);
  EXPECT_EQ(arena.Bytes(0, pk.size()), pk);
  EXPECT_EQ(Kept() + Redone(), 0u);

  items.clear();
  items.push_back(SliceItem(k, arena.Slices(0, pk.size(), 2)));       // speculated, kept
  items.push_back(SliceItem(k, arena.Slices(pk.size(), pk.size())));  // fanned out from it
  res = getter_.Get(items, 0, nullptr);
  for (const auto& r : res) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(arena.Bytes(0, pk.size()), pk);
  EXPECT_EQ(arena.Bytes(pk.size(), pk.size()), pk);
  EXPECT_EQ(Kept(), 1u);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(BatchGetSpeculation, OnlyGetsWithinTheBudgetSpeculate) {
  SpeculationSource source{.index = index_.get(), .segments = {}, .resolve = resolve_};
  for (auto& b : local_->backing) source.segments.push_back({b.data(), b.size()});
  source.max_job_bytes = 100'000;
  getter_.SetSpeculation(SpeculationSource(source));
  std::vector<std::string> keys, payloads;
  for (int k = 0; k < 4; ++k) {
    keys.push_back("budget-" + std::to_string(k));
    payloads.push_back(Payload(40'000, 600 + k));
  }
  for (const auto& s : Put(keys, payloads)) ASSERT_TRUE(s.ok()) << s;
  for (const auto& r : GetAndCheck(keys, payloads)) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(Kept() + Redone() + metrics_.get_speculative_late.Value(), 0u)
      << "160,000 bytes: read as usual";
  keys.resize(2);
  payloads.resize(2);
  keys.push_back("not-held");  // a miss: counts as one of the keys asked
  payloads.push_back(std::string(10, kSentinel));
  auto res = GetAndCheck(keys, payloads);
  EXPECT_TRUE(res[0].status.ok() && res[1].status.ok());
  EXPECT_EQ(CodeOf(res[2].status), Code::kNotFound);
  EXPECT_EQ(Kept(), 2u) << "two keys fit in 100,000 bytes";
  source = SpeculationSource{.index = index_.get(), .segments = {}, .resolve = resolve_};
  for (auto& b : local_->backing) source.segments.push_back({b.data(), b.size()});
  source.max_job_keys = 2;
  getter_.SetSpeculation(std::move(source));
  res = GetAndCheck(keys, payloads);
  EXPECT_EQ(Kept(), 2u) << "three keys asked, more than max_job_keys: no speculation";
}

TEST(SpeculativeCopier, OneJobAtATimeAndFinishCancelsOrCopiesWhatIsNotStarted) {
  SpeculativeCopier copier;
  const std::string src = Payload(1 << 20, 9);
  std::vector<char> d1(src.size(), kSentinel), d2(src.size(), kSentinel);
  // Long enough (hundreds of MiB copied by the helper alone) to be running at the second start.
  std::vector<SpeculativeCopier::Item> items(512);
  items[0] = {src.data(), src.size(), {LocalBuffer{d1.data(), d1.size()}}};
  for (size_t i = 1; i < items.size(); ++i) {
    items[i] = {src.data(), src.size(), {LocalBuffer{d2.data(), d2.size()}}};
  }
  std::shared_ptr<SpeculativeCopier::Job> job = copier.TryStart(items);
  ASSERT_NE(job, nullptr);
  EXPECT_TRUE(copier.busy());
  EXPECT_EQ(copier.TryStart(items), nullptr) << "busy: the second get does not speculate";
  std::vector<bool> wanted(items.size(), false);
  wanted[0] = true;
  const auto& out = SpeculativeCopier::Finish(*job, wanted);
  // Items copied whole hold the source's bytes and its checksum; the rest were cancelled before
  // the helper reached them, or abandoned at a chunk (not wanted).
  size_t copied = 0;
  for (const auto& item : out) copied += item.copied ? 1 : 0;
  EXPECT_LT(copied, items.size()) << "items not started are cancelled";
  const uint64_t want = ScatterChecksum({LocalBuffer{const_cast<char*>(src.data()), src.size()}});
  if (out[0].copied) {
    EXPECT_EQ(std::string(d1.data(), d1.size()), src);
    EXPECT_EQ(out[0].checksum, want);
  }
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].copied) {
      EXPECT_EQ(out[i].checksum, want) << i;
    }
  }
  // The helper is free again once Finish() returned: the same get's next call may speculate.
  // Every item wanted (each with its own destination, as a get's are): those the helper has not
  // started are copied by Finish()'s caller beside it, and every item is then whole with the
  // source's checksum.
  std::vector<std::vector<char>> dests(32, std::vector<char>(src.size(), kSentinel));
  std::vector<SpeculativeCopier::Item> distinct;
  for (auto& d : dests)
    distinct.push_back({src.data(), src.size(), {LocalBuffer{d.data(), d.size()}}});
  std::shared_ptr<SpeculativeCopier::Job> next = copier.TryStart(distinct);
  ASSERT_NE(next, nullptr);
  const auto& all = SpeculativeCopier::Finish(*next, std::vector<bool>(distinct.size(), true));
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_TRUE(all[i].copied) << i;
    EXPECT_EQ(all[i].checksum, want) << i;
    EXPECT_TRUE(std::string(dests[i].data(), dests[i].size()) == src) << i;
  }
  EXPECT_FALSE(copier.busy());
  // Paused: the helper never takes the job, Finish() takes it back and copies it all.
  copier.PauseForTest(true);
  std::vector<SpeculativeCopier::Item> few(items.begin(), items.begin() + 4);
  std::shared_ptr<SpeculativeCopier::Job> paused = copier.TryStart(few);
  ASSERT_NE(paused, nullptr);
  for (const auto& item : SpeculativeCopier::Finish(*paused, {true, false, true, true})) {
    EXPECT_EQ(item.copied, item.after_answer);
  }
  EXPECT_FALSE(copier.busy());
  copier.PauseForTest(false);
}

}  // namespace
}  // namespace mc::client::testing
