// The one reader of the JSON-lines data files (../shared/data/*.jsonl: one example per line with
// id, task, chunks, question, answers). Used by eval, calibration, ingest and the tier benchmark;
// malformed input fails with the file, the line and the field named.
#pragma once

#include <string>
#include <vector>

namespace ct {

struct DataExample {
  std::string id;    // "<task>-<NNNN>"; may be empty unless DataReadOptions::eval_fields
  std::string task;  // e.g. "hotpotqa"
  std::vector<std::string> chunks;   // non-empty, each non-empty
  std::string question;              // empty only without DataReadOptions::question
  std::vector<std::string> answers;  // may be empty (no gold: fidelity only)
  std::string file;                  // where it was read from, for messages
  int line = 0;                      // 1-based
};

struct DataReadOptions {
  int limit = 0;             // > 0: stop after this many examples
  bool question = true;      // "question" required (ingest needs only the chunks)
  bool eval_fields = false;  // "id", "task", "answers" required and ids unique (evaluation)
  bool allow_empty = false;  // a file without examples is not an error
};

// Reads the non-blank lines of `path`. Fields that are present must have their type even when
// not required. Throws ct::Error "<path>:<line>: ..." for invalid JSON, a missing or mistyped
// field, an empty chunk list or chunk, or a duplicate id; "cannot open data file '<path>'"; and
// "data file '<path>' holds no examples" when nothing was read (unless allow_empty).
std::vector<DataExample> read_data_jsonl(const std::string& path, const DataReadOptions& opt = {});

}  // namespace ct
