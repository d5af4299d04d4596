#include "dlm/common/error.h"

#include <filesystem>
#include <new>

#include <gtest/gtest.h>

TEST(Error, FormatsFileAndLine) {
  try {
    dlm::fail_at_line("in.jsonl", 12, "expected a string for key \"text\"");
    FAIL();
  } catch (const dlm::Error& e) {
    EXPECT_STREQ(e.what(), "in.jsonl:12: expected a string for key \"text\"");
    EXPECT_EQ(e.where().line, 12u);
    EXPECT_EQ(e.message(), "expected a string for key \"text\"");
  }
}

TEST(Error, FormatsOffset) {
  try {
    dlm::fail_at_offset("a.idx", 17, "unknown dtype code 9");
    FAIL();
  } catch (const dlm::Error& e) {
    EXPECT_STREQ(e.what(), "a.idx: offset 17: unknown dtype code 9");
  }
}

TEST(Error, PlainMessage) {
  EXPECT_THROW(dlm::fail("bad"), dlm::Error);
  try {
    dlm::fail("bad");
  } catch (const dlm::Error& e) {
    EXPECT_STREQ(e.what(), "bad");
  }
}

// no exception's what() reaches a user raw.
TEST(Error, UserMessageOfAnyException) {
  EXPECT_EQ(dlm::user_message(std::bad_alloc()), "out of memory; no output written");
  const std::filesystem::filesystem_error fs("filesystem error: cannot stat", "/x/" + std::string(300, 'y'),
                                             std::make_error_code(std::errc::filename_too_long));
  EXPECT_EQ(dlm::user_message(fs), "/x/" + std::string(300, 'y') + ": File name too long");
  EXPECT_EQ(dlm::user_message(dlm::Error(dlm::Location{"f.idx"}, "bad")), "f.idx: bad");
}
