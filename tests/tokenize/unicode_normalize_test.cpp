// Normalization as `tokenizers` does it: the Unicode algorithm, except that code points newer than
// its tables are plain starters (values checked against tokenizers 0.23.3's NFC/NFD/NFKD).
#include <gtest/gtest.h>

#include "../../libdata/tokenize/unicode_normalize.h"

namespace dlm::data::tok {
namespace {

TEST(UnicodeNormalize, AsciiAndLatinPassThrough) {
  EXPECT_EQ(unicode_normalize("plain text", UnicodeForm::kNfkc), "plain text");
  EXPECT_EQ(unicode_normalize("caf\u00e9", UnicodeForm::kNfc), "caf\u00e9");
}

TEST(UnicodeNormalize, ComposesDecomposesAndReordersKnownMarks) {
  EXPECT_EQ(unicode_normalize("cafe\u0301", UnicodeForm::kNfc), "caf\u00e9");
  EXPECT_EQ(unicode_normalize("caf\u00e9", UnicodeForm::kNfd), "cafe\u0301");
  // Acute (class 230) after grave-below (220): canonical order puts the lower class first.
  EXPECT_EQ(unicode_normalize("\u0301\u0316", UnicodeForm::kNfc), "\u0316\u0301");
  EXPECT_EQ(unicode_normalize("\uFB01", UnicodeForm::kNfkc), "fi");
  EXPECT_EQ(unicode_normalize("\uFB01", UnicodeForm::kNfc), "\uFB01");
}

TEST(UnicodeNormalize, CodePointsNewerThanTheReferenceAreStarters) {
  // U+07FD NKO DANTAYALAN (Unicode 11, class 220): tokenizers leaves it after U+07F3 (class 230).
  EXPECT_EQ(unicode_normalize("\u07F3\u07FD", UnicodeForm::kNfc), "\u07F3\u07FD");
  // ...and nothing reorders across it: the marks on each side are ordered on their own.
  EXPECT_EQ(unicode_normalize("\u0301\u0316\u07FD\u0301\u0316", UnicodeForm::kNfd),
            "\u0316\u0301\u07FD\u0316\u0301");
  // U+1F16C RAISED MR SIGN (Unicode 12) has a compatibility decomposition tokenizers does not know.
  EXPECT_EQ(unicode_normalize("\U0001F16C", UnicodeForm::kNfkc), "\U0001F16C");
  // A known code point of the same block still decomposes: U+1F16A RAISED MC SIGN (Unicode 6.1).
  EXPECT_EQ(unicode_normalize("\U0001F16A", UnicodeForm::kNfkc), "MC");
}

}  // namespace
}  // namespace dlm::data::tok
