// Text-quality metrics for evaluation runs: LongBench-style QA F1 and ROUGE-L F, matching the
// Python references (LongBench qa_f1_score; rouge-score's RougeScorer(['rougeL'])) to rounding.
// tests/fixtures/metrics_ref.json (from tools/make_metrics_fixture.py) pins both.
#pragma once

#include <string>
#include <vector>

namespace ct {

// Token F1 after SQuAD/LongBench answer normalisation: Unicode lower-case (Python str.lower()),
// drop ASCII punctuation (string.punctuation), replace the words a/an/the with spaces (word
// boundaries as Python's Unicode \b), split on Python whitespace (str.split()), then F1 over the
// token multisets. 0 when there is no overlap, including when either side is empty (LongBench
// scores "" vs "" as 0, unlike SQuAD's exact-match convention). Input is UTF-8; invalid bytes
// are kept as opaque non-word characters.
double qa_f1(const std::string& prediction, const std::string& gold);

// Max of qa_f1 over the golds; 0 for an empty list.
double qa_f1_max(const std::string& prediction, const std::vector<std::string>& golds);

// ROUGE-L F-measure as rouge-score 0.1.2 with use_stemmer=False: tokens are the runs of [a-z0-9]
// after Python lower-casing (so only ASCII letters/digits count, plus U+0130 -> "i" and the
// Kelvin sign -> "k"); F = 2PR/(P+R) from the longest common subsequence; 0 if either side has
// no tokens.
double rouge_l_f(const std::string& prediction, const std::string& reference);

// Max of rouge_l_f over the references; 0 for an empty list.
double rouge_l_f_max(const std::string& prediction, const std::vector<std::string>& references);

}  // namespace ct
