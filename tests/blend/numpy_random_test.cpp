// NumpyRandomState against values printed by numpy 2.3.5's numpy.random.RandomState.
#include "dlm/data/numpy_random.h"

#include <gtest/gtest.h>

#include <numeric>

#include "dlm/common/error.h"

using dlm::data::NumpyRandomState;

TEST(NumpyRandomState, RawStreamMatchesNumpy) {
  // RandomState(1234).randint(0, 2**32, size=5, dtype=uint64): the full 32-bit range is the raw output.
  NumpyRandomState r(1234);
  const std::uint32_t expect[] = {822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u};
  for (auto e : expect) EXPECT_EQ(r.next_uint32(), e);
}

TEST(NumpyRandomState, RandomSampleAndUniform) {
  NumpyRandomState r(1234);
  EXPECT_EQ(r.random_sample(), 0.1915194503788923);
  EXPECT_EQ(r.random_sample(), 0.6221087710398319);
  EXPECT_EQ(r.random_sample(), 0.4377277390071145);
  NumpyRandomState u(0);
  EXPECT_EQ(u.uniform(0.5, 3.0), 1.8720337598183119);
  EXPECT_EQ(u.uniform(0.5, 3.0), 2.2879734159310487);
  EXPECT_EQ(u.uniform(0.5, 3.0), 2.0069084401791097);
  NumpyRandomState m(99);  // uniform, randint and random_sample share one stream
  EXPECT_EQ(m.uniform(-1e3, 1e3), 344.55711726158347);
  EXPECT_EQ(m.randint(0, 5), 1);
  EXPECT_EQ(m.random_sample(), 0.8319480853192148);
}

TEST(NumpyRandomState, Randint) {
  NumpyRandomState r(42);
  for (std::int64_t e : {103, 436, 861, 271, 107}) EXPECT_EQ(r.randint(1, 1000), e);
  // Ranges above 2^32 take the 64-bit masked path (two outputs, high word first).
  const std::vector<std::int64_t> wide = {307513896631, 86569440865, 520361034189, 919372468549};
  EXPECT_EQ(r.randint(-5, std::int64_t{1} << 40, 4), wide);
  EXPECT_EQ(r.randint(0, std::int64_t{1} << 32), 1972458954);
  EXPECT_EQ(r.randint(INT64_MIN, INT64_MAX), 6754757701360545140);

  NumpyRandomState s(3);
  const std::vector<std::int64_t> s_expect = {7902520963, 521102280, 2445173525,
                                              6172134035, 4469474985, 2984244884};
  EXPECT_EQ(s.randint(0, (std::int64_t{1} << 33) + 5, 6), s_expect);

  NumpyRandomState t(5);  // a one-value range draws nothing
  EXPECT_EQ(t.randint(10, 11, 3), (std::vector<std::int64_t>{10, 10, 10}));
  EXPECT_EQ(t.randint(0, std::int64_t{1} << 32, 2), (std::vector<std::int64_t>{953453411, 236996814}));
  EXPECT_EQ(t.randint(INT64_MIN, INT64_MAX, 2),
            (std::vector<std::int64_t>{6838803925648402109, -5410076705834541962}));
  EXPECT_THROW(t.randint(3, 3), dlm::Error);
}

TEST(NumpyRandomState, ShuffleAndPermutation) {
  const std::vector<std::int64_t> expect = {1, 17, 2, 5, 11, 0, 18, 6, 13, 19, 10, 14, 8, 16, 9, 12, 7, 3, 4, 15};
  NumpyRandomState r(7);
  std::vector<std::int32_t> a(20);
  std::iota(a.begin(), a.end(), 0);
  r.shuffle(a);
  EXPECT_EQ(std::vector<std::int64_t>(a.begin(), a.end()), expect);
  NumpyRandomState p(7);
  EXPECT_EQ(p.permutation(20), expect);
  NumpyRandomState top(4294967295u);
  EXPECT_EQ(top.permutation(12), (std::vector<std::int64_t>{11, 8, 5, 9, 1, 10, 6, 0, 4, 7, 2, 3}));

  NumpyRandomState big(11);
  std::vector<std::int64_t> b(100000);
  std::iota(b.begin(), b.end(), 0);
  big.shuffle(b);
  EXPECT_EQ(std::vector<std::int64_t>(b.begin(), b.begin() + 5),
            (std::vector<std::int64_t>{40645, 39142, 29374, 24411, 51509}));
  EXPECT_EQ(std::vector<std::int64_t>(b.end() - 3, b.end()), (std::vector<std::int64_t>{21584, 36543, 10137}));
  std::uint64_t weighted = 0;  // sum(a * arange(n)) mod 2^61 over the whole permutation
  for (std::size_t i = 0; i < b.size(); ++i) weighted += static_cast<std::uint64_t>(b[i]) * i;
  EXPECT_EQ(weighted % (std::uint64_t{1} << 61), 250185450903969u);
}

TEST(NumpyRandomState, ArraySeed) {
  const std::uint32_t k1[] = {1, 2, 3};
  NumpyRandomState r(k1);
  EXPECT_EQ(r.permutation(10), (std::vector<std::int64_t>{0, 4, 8, 1, 2, 6, 7, 5, 3, 9}));
  EXPECT_EQ(r.random_sample(), 0.9131728030153596);
  const std::uint32_t k2[] = {0xdeadbeefu, 5u, 0xffffffffu};
  NumpyRandomState s(k2);
  EXPECT_EQ(s.permutation(10), (std::vector<std::int64_t>{9, 4, 8, 2, 1, 7, 5, 3, 0, 6}));
}
