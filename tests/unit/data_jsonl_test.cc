// read_data_jsonl: the one reader of the data files. Errors name the file, the line and the field;
// optional fields are typed when present; limits and the eval-only requirements.
#include "core/data_jsonl.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"

namespace ct {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string p = testing::TempDir() + name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

std::string error_of(const std::string& path, const DataReadOptions& opt = {}) {
  try {
    read_data_jsonl(path, opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataJsonl, ReadsOptionalFieldsAndHonoursTheLimit) {
  const std::string p =
      write_temp("ct_data_ok.jsonl", R"({"chunks": ["a", "b"], "question": "q?"})"
                                     "\n\n"
                                     R"({"id": "t-1", "chunks": ["c"], "question": "r?"})"
                                     "\n"
                                     R"({"id": "t-2", "chunks": ["d"], "question": "s?"})"
                                     "\n");
  const auto all = read_data_jsonl(p);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].id, "");
  EXPECT_EQ(all[0].chunks, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(all[1].line, 3);
  EXPECT_EQ(all[1].file, p);
  EXPECT_EQ(read_data_jsonl(p, {.limit = 2}).size(), 2u);
  // The eval requirements: id, task and answers must be there.
  EXPECT_NE(error_of(p, {.eval_fields = true}).find(p + ":1: missing field 'id'"),
            std::string::npos);
}

TEST(DataJsonl, ErrorsNameFileLineAndField) {
  std::string p = write_temp("ct_data_bad1.jsonl", R"({"chunks": ["a"], "question": 7})"
                                                   "\n");
  EXPECT_NE(error_of(p).find(p + ":1: field 'question' must be a string, got number"),
            std::string::npos)
      << error_of(p);
  p = write_temp("ct_data_bad2.jsonl",
                 "\n"
                 R"({"chunks": ["a", 3], "question": "q"})"
                 "\n");
  EXPECT_NE(error_of(p).find(p + ":2: chunks[1] must be a string, got number"), std::string::npos)
      << error_of(p);
  p = write_temp("ct_data_bad3.jsonl", R"({"chunks": ["a"]})"
                                       "\n");
  EXPECT_NE(error_of(p).find(":1: missing field 'question'"), std::string::npos);
  EXPECT_EQ(error_of(p, {.question = false}), "");  // ingest needs only the chunks
  p = write_temp("ct_data_bad4.jsonl", R"({"chunks": ["a", ""], "question": "q"})"
                                       "\n");
  EXPECT_NE(error_of(p).find(":1: example '' chunk 1 is empty"), std::string::npos);
  p = write_temp("ct_data_bad5.jsonl", R"({"chunks": ["a"], "question": "q", "answers": "x"})"
                                       "\n");
  EXPECT_NE(error_of(p).find(":1: field 'answers' must be a list of strings, got string"),
            std::string::npos);
  p = write_temp("ct_data_empty.jsonl", "\n\n");
  EXPECT_NE(error_of(p).find("data file '" + p + "' holds no examples"), std::string::npos);
  EXPECT_EQ(error_of(p, {.allow_empty = true}), "");
}

}  // namespace
}  // namespace ct
