#include "engine/tokenizer.h"

#include <cctype>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <optional>
#include <queue>

namespace engine {

using expertd::make_error;

namespace {

// Token types (llama.cpp's llama_token_type).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;
constexpr uint8_t kLstrip = 1, kRstrip = 2;

// GPT-2 byte-level encoding: printable bytes stand for themselves, the others map to U+0100...
struct ByteCodec {
  std::string enc[256];
  std::unordered_map<uint32_t, uint8_t> dec;
  ByteCodec() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      enc[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                         : std::string{static_cast<char>(0xC0 | (cp >> 6)),
                                       static_cast<char>(0x80 | (cp & 0x3F))};
      dec[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteCodec& codec() {
  static const ByteCodec c;
  return c;
}

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;  // invalid lead byte: one byte
}

// Merges adjacent symbols of `text` (its UTF-8 characters at first) until no pair merges.
// priority(a, b) gives the merge order of a pair (lower first; ties: leftmost) or nothing when
// the pair does not merge. Returns the final symbols as (start, length).
template <class Priority>
std::vector<std::pair<size_t, size_t>> merge_symbols(const std::string& text, Priority priority) {
  struct Sym {
    size_t start, len;
    int prev, next;
  };
  std::vector<Sym> sym;
  for (size_t o = 0; o < text.size();) {
    size_t n = std::min(text.size() - o, utf8_len(static_cast<unsigned char>(text[o])));
    sym.push_back({o, n, static_cast<int>(sym.size()) - 1, -1});
    o += n;
  }
  for (size_t i = 0; i + 1 < sym.size(); ++i) sym[i].next = static_cast<int>(i + 1);
  struct Bigram {
    int left, right;
    double priority;
    size_t len;
  };
  auto later = [](const Bigram& a, const Bigram& b) {
    return a.priority > b.priority || (a.priority == b.priority && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(later)> q(later);
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    auto p = priority(std::string_view(text).substr(sym[l].start, sym[l].len),
                      std::string_view(text).substr(sym[r].start, sym[r].len));
    if (p) q.push({l, r, *p, sym[l].len + sym[r].len});
  };
  for (size_t i = 1; i < sym.size(); ++i) add(static_cast<int>(i - 1), static_cast<int>(i));
  while (!q.empty()) {
    Bigram bg = q.top();
    q.pop();
    Sym &l = sym[bg.left], &r = sym[bg.right];
    // Outdated when either side merged meanwhile (a length changed, or a side is gone).
    if (l.len == 0 || r.len == 0 || l.next != bg.right || l.len + r.len != bg.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }
  std::vector<std::pair<size_t, size_t>> out;
  for (const Sym& x : sym)
    if (x.len) out.emplace_back(x.start, x.len);
  return out;
}

// The pre-tokenizer regexes of llama.cpp's pre-tokenizer types, applied in sequence.
const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Not a regex: llama.cpp's name for afmoe's digit grouping, done by group_digits().
const char* kDigitGroups = R"(\p{AFMoE_digits})";

std::vector<std::string> regexes_for(const std::string& pre, bool* ignore_merges) {
  *ignore_merges = false;
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
    *ignore_merges = true;
    return {kLlama3};
  }
  if (pre == "glm4" || pre == "glm5") {  // GLM-4.5 to GLM-5: llama3's split, whole words first
    *ignore_merges = true;
    return {kLlama3};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2" || pre == "megrez" ||
      pre == "solar-open" || pre == "hunyuan")
    return {kQwen2};
  if (pre == "tekken") {  // Mistral: case-change splits, single digits; as llama.cpp writes it
    *ignore_merges = true;
    return {
        R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  }
  if (pre == "qwen35")  // Qwen3.5: letters with their combining marks
    return {
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  if (pre == "falcon")
    return {R"([\p{P}\$\+<=>\^~\|`]+)",
            R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))",
            R"([0-9][0-9][0-9])"};
  if (pre == "gpt-2" || pre == "olmo" || pre == "mpt" || pre == "jais" || pre == "phi-2" ||
      pre == "jina-es" || pre == "trillion" || pre == "exaone4")
    return {kGpt2};
  // (clang-format would re-split these UTF-8 literals on every run)
  // clang-format off
  if (pre == "deepseek-llm")
    return {R"([\r\n])",
            // Written with \x{} escapes where Unicode normalisation would change the character.
            "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-"
            "ὗὙὛὝὟ-\\x{1F7D}ᾀ-ᾴᾶ-ᾼ\\x{1FBE}ῂ-ῄῆ-ῌῐ-\\x{1FD3}ῖ-\\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-"
            "ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            "\\s?[!-/:-~！-／：-～‘-‟　-。]+", R"(\s+$)", "[一-龥ࠀ-一가-퟿]+", R"(\p{N}+)"};
  // clang-format on
  if (pre == "deepseek-coder")
    return {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", "[一-龥ࠀ-一가-퟿]+", R"(\p{N})"};
  // (Tencent's Hunyuan dense and Hy4 tokenizers, and JoyAI's, split as DeepSeek-V3's does)
  if (pre == "deepseek-v3" || pre == "hunyuan-dense" || pre == "hy_v4" || pre == "joyai-llm")
    return {
        R"(\p{N}{1,3})", "[一-龥぀-ゟ゠-ヿ]+",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  // gpt-4o's split, then llama.cpp's own form of it, which it applies after (letters by case
  // without their combining marks): the pieces are where both split.
  if (pre == "gpt-4o" || pre == "llama4" || pre == "minimax-m2")
    return {
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  if (pre == "kimi-k2")  // Kimi-K2/K3: Han runs apart; the letter classes exclude Han
    return {
        R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  // K-EXAONE: runs of letters joined across single spaces, one digit at a time
  if (pre == "exaone-moe")
    return {
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)"};
  // Ling / Ring (bailingmoe, bailingmoe2) and LLaDA-MoE: llama.cpp's greedy form of the
  // tokenizer.json split (one newline at a time after spaces)
  if (pre == "bailingmoe" || pre == "bailingmoe2" || pre == "llada-moe")
    return {
        R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"};
  // Trinity (afmoe): runs of digits cut into threes from the right, the leading 1-2 digits joined
  // to the text before the run (llama.cpp's custom split, reproduced as it behaves); then Asian
  // scripts apart; then DeepSeek-V3's main split.
  // clang-format off
  if (pre == "afmoe")
    return {kDigitGroups,
            "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
            R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  // clang-format on
  // Laguna: lines apart from runs of newlines first, then Qwen2's split.
  if (pre == "laguna") return {R"([^\n]+|[\n]+)", kQwen2};
  if (pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "smollm" ||
      pre == "codeshell")
    return {R"(\p{N})", kGpt2};
  return {};  // unknown: the caller refuses it
}

}  // namespace

struct Tokenizer::Regexes {
  std::vector<pcre2_code*> codes;
  std::vector<char> digit_groups;  // per step: kDigitGroups (its code finds runs of \p{N})
  ~Regexes() {
    for (auto* c : codes) pcre2_code_free(c);
  }
};

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

expertd::Result<Tokenizer> Tokenizer::load(const gguf::Model& f) {
  Tokenizer t;
  t.model_ = std::string(f.get_string("tokenizer.ggml.model").value_or(""));
  t.pre_ = std::string(f.get_string("tokenizer.ggml.pre").value_or("default"));
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) return make_error(f.path() + ": no tokenizer.ggml.tokens");
  if (t.model_ != "gpt2" && t.model_ != "llama")
    return make_error(f.path() + ": tokenizer model '" + t.model_ +
                      "' is not supported (gpt2, llama)");
  for (auto s : *tokens) t.text_.emplace_back(s);
  auto types = f.get_number_array("tokenizer.ggml.token_type");
  auto scores = f.get_number_array("tokenizer.ggml.scores");
  t.type_.assign(t.text_.size(), kNormal);
  t.score_.assign(t.text_.size(), 0.0f);
  if (types && types->size() == t.text_.size())
    for (size_t i = 0; i < types->size(); ++i) t.type_[i] = static_cast<int32_t>((*types)[i]);
  if (scores && scores->size() == t.text_.size())
    for (size_t i = 0; i < scores->size(); ++i) t.score_[i] = static_cast<float>((*scores)[i]);
  for (size_t i = 0; i < t.text_.size(); ++i) t.id_of_.emplace(t.text_[i], static_cast<int32_t>(i));
  auto id = [&](const char* key, int32_t fallback) {
    auto v = f.get_int(key);
    return v && *v >= 0 && *v < static_cast<int64_t>(t.text_.size()) ? static_cast<int32_t>(*v)
                                                                     : fallback;
  };
  if (t.model_ == "gpt2") {
    auto merges = f.get_string_array("tokenizer.ggml.merges");
    // Kimi-K2's vocab may come without merges (llama.cpp then keeps every byte-level symbol)
    if (!merges && t.pre_ != "kimi-k2")
      return make_error(f.path() + ": BPE tokenizer without tokenizer.ggml.merges");
    if (merges)
      for (size_t i = 0; i < merges->size(); ++i)
        t.merge_rank_.emplace(std::string((*merges)[i]), static_cast<int32_t>(i));
    auto exprs = regexes_for(t.pre_, &t.ignore_merges_);
    if (exprs.empty())
      return make_error(f.path() + ": pre-tokenizer '" + t.pre_ + "' is not supported");
    t.regexes_ = std::make_unique<Regexes>();
    for (const auto& expr : exprs) {
      const bool groups = expr == kDigitGroups;
      const std::string e = groups ? R"(\p{N}+)" : expr;
      int err;
      PCRE2_SIZE off;
      pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(e.c_str()), e.size(),
                                    PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
      if (!c)
        return make_error("pre-tokenizer regex failed to compile at offset " + std::to_string(off));
      pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
      t.regexes_->codes.push_back(c);
      t.regexes_->digit_groups.push_back(groups);
    }
    t.bos_ = id("tokenizer.ggml.bos_token_id", 11);
    t.eos_ = id("tokenizer.ggml.eos_token_id", 11);
    // llama.cpp adds BOS for tekken unless the file says otherwise
    t.add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token").value_or(t.pre_ == "tekken");
  } else {
    t.bos_ = id("tokenizer.ggml.bos_token_id", 1);
    t.eos_ = id("tokenizer.ggml.eos_token_id", 2);
    t.unk_ = id("tokenizer.ggml.unknown_token_id", 0);
    t.add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
    t.add_space_prefix_ = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  }
  t.eot_ = id("tokenizer.ggml.eot_token_id", -1);
  if (t.eot_ < 0)
    for (const char* s : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"})
      if (auto it = t.id_of_.find(s); it != t.id_of_.end()) {
        t.eot_ = it->second;
        break;
      }
  // llama.cpp's end-of-generation tokens, found by text: it makes them control tokens whatever
  // the file says (so without parse_special they are plain text: Phi-3's user-defined </s>), and
  // generation stops at any of them. gpt-oss's channel markers are always user-defined.
  for (const char* s : {"<|eot_id|>",
                        "<|im_end|>",
                        "<|end|>",
                        "<|return|>",
                        "<|call|>",
                        "<|flush|>",
                        "<|calls|>",
                        "<end_of_turn>",
                        "<|endoftext|>",
                        "</s>",
                        "<|eom_id|>",
                        "<EOT>",
                        "_<EOT>",
                        "[EOT]",
                        "[EOS]",
                        "<|end_of_text|>",
                        "<end_of_utterance>",
                        "<eos>",
                        "<turn|>",
                        "<|tool_response>",
                        "<\xEF\xBD\x9C"
                        "end\xE2\x96\x81"
                        "of\xE2\x96\x81"
                        "sentence\xEF\xBD\x9C>",
                        "[e~["})
    if (auto it = t.id_of_.find(s); it != t.id_of_.end()) {
      t.eog_.insert(it->second);
      t.type_[it->second] = kControl;
    }
  for (const char* s : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
    if (auto it = t.id_of_.find(s); it != t.id_of_.end()) t.type_[it->second] = kUserDefined;
  for (size_t i = 0; i < t.text_.size(); ++i)
    if ((t.type_[i] == kControl || t.type_[i] == kUserDefined || t.type_[i] == kUnknown) &&
        !t.text_[i].empty())
      t.specials_.push_back(static_cast<int32_t>(i));
  // Strip attributes by model name, as llama.cpp sets them: Phi-3 drops the whitespace after
  // its special tokens (and </s>), except <unk>, <s> and <|endoftext|>; a few BPE models drop
  // the whitespace before <mask>.
  std::string name(f.get_string("general.name").value_or(""));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto set = [&](const char* text, uint8_t bits, bool on) {
    if (auto it = t.id_of_.find(text); it != t.id_of_.end())
      on ? (t.strip_[it->second] |= bits) : (t.strip_[it->second] &= uint8_t(~bits));
  };
  if (t.pre_.find("jina-v2-") == 0) {
    set("<mask>", kLstrip, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : t.specials_) t.strip_[id] |= kRstrip;
    set("</s>", kRstrip, true);
    for (const char* s : {"<unk>", "<s>", "<|endoftext|>"}) set(s, kRstrip, false);
  }
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [&](int32_t a, int32_t b) { return t.text_[a].size() > t.text_[b].size(); });
  return t;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id == eos_ || id == eot_ || eog_.count(id) != 0;
}

int32_t Tokenizer::find(std::string_view text) const {
  auto it = id_of_.find(std::string(text));
  return it == id_of_.end() ? -1 : it->second;
}

namespace {

size_t utf8_advance(const std::string& s, size_t at, size_t n_chars) {
  for (; n_chars > 0 && at < s.size(); --n_chars) at += utf8_len(static_cast<unsigned char>(s[at]));
  return std::min(at, s.size());
}

// afmoe's digit step as llama.cpp runs it: in each run of n digits (`digits` finds them), the
// first n % 3 (else 3) join whatever precedes the run since the last cut, then threes follow.
void group_digits(pcre2_code* digits, pcre2_match_data* md, const std::string& p,
                  std::vector<std::string>& out) {
  size_t at = 0, last = 0;
  while (at < p.size() && pcre2_match(digits, reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), at,
                                      0, md, nullptr) >= 0) {
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    size_t n = 0;
    for (size_t i = s; i < e; i += utf8_len(static_cast<unsigned char>(p[i]))) ++n;
    size_t cut = utf8_advance(p, s, n % 3 ? n % 3 : 3);
    out.push_back(p.substr(last, cut - last));
    while (cut < e) {
      const size_t next = utf8_advance(p, cut, 3);
      out.push_back(p.substr(cut, next - cut));
      cut = next;
    }
    last = at = e;
  }
  if (last < p.size()) out.push_back(p.substr(last));
}

}  // namespace

// Each regex splits every piece further; unmatched stretches stay pieces of their own.
std::vector<std::string> Tokenizer::pre_split(const std::string& text) const {
  std::vector<std::string> pieces{text};
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  for (size_t step = 0; step < regexes_->codes.size(); ++step) {
    pcre2_code* re = regexes_->codes[step];
    std::vector<std::string> next;
    for (const std::string& p : pieces) {
      if (regexes_->digit_groups[step]) {
        group_digits(re, md, p, next);
        continue;
      }
      size_t at = 0, last = 0;
      while (at <= p.size()) {
        int rc =
            pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), at, 0, md, nullptr);
        if (rc < 0) break;
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s) {  // empty match: step one character
          at = s + (s < p.size() ? utf8_len(static_cast<unsigned char>(p[s])) : 1);
          continue;
        }
        if (s > last) next.push_back(p.substr(last, s - last));
        next.push_back(p.substr(s, e - s));
        last = at = e;
      }
      if (last < p.size()) next.push_back(p.substr(last));
    }
    pieces = std::move(next);
  }
  pcre2_match_data_free(md);
  return pieces;
}

void Tokenizer::bpe_word(const std::string& raw, std::vector<int32_t>& out) const {
  std::string word;
  for (unsigned char c : raw) word += codec().enc[c];
  if (ignore_merges_)
    if (auto it = id_of_.find(word); it != id_of_.end()) return out.push_back(it->second);
  // The lowest-ranked merge first (ties: leftmost), as llama.cpp does.
  auto parts =
      merge_symbols(word, [&](std::string_view a, std::string_view b) -> std::optional<double> {
        auto it = merge_rank_.find(std::string(a) + " " + std::string(b));
        if (it == merge_rank_.end()) return std::nullopt;
        return it->second;
      });
  for (auto [start, len] : parts) {
    std::string piece = word.substr(start, len);
    if (auto it = id_of_.find(piece); it != id_of_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char c : piece)  // not in the vocabulary: its single characters
      if (auto it = id_of_.find(std::string(1, c)); it != id_of_.end()) out.push_back(it->second);
  }
}

void Tokenizer::spm_text(const std::string& text, std::vector<int32_t>& out) const {
  // The best-scoring pair that forms a vocabulary token first (ties: leftmost).
  auto parts =
      merge_symbols(text, [&](std::string_view a, std::string_view b) -> std::optional<double> {
        auto it = id_of_.find(std::string(a) + std::string(b));
        if (it == id_of_.end()) return std::nullopt;
        return -static_cast<double>(score_[it->second]);
      });
  // Every merge formed a vocabulary token, so a final symbol is a token or a single character
  // outside the vocabulary, which falls back to its bytes.
  for (auto [start, len] : parts) {
    std::string s = text.substr(start, len);
    if (auto it = id_of_.find(s); it != id_of_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char c : s) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", c);
      auto it = id_of_.find(buf);
      out.push_back(it != id_of_.end() ? it->second : unk_);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  // Split the text around special tokens (control tokens only when parse_special).
  struct Frag {
    std::string text;
    int32_t special;
  };
  std::vector<Frag> frags{{std::string(text), -1}};
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  for (int32_t sp : specials_) {
    // Without parse_special only user-defined tokens split the text (llama.cpp's rule).
    if (!parse_special && (type_[sp] == kControl || type_[sp] == kUnknown)) continue;
    const std::string& st = text_[sp];
    auto attr = strip_.find(sp);
    const uint8_t strip = attr == strip_.end() ? 0 : attr->second;
    std::vector<Frag> next;
    for (auto& f : frags) {
      if (f.special >= 0) {
        next.push_back(f);
        continue;
      }
      size_t at = 0;
      for (size_t hit; (hit = f.text.find(st, at)) != std::string::npos;) {
        size_t left = hit - at;
        if (strip & kLstrip)
          while (left > 0 && space(f.text[at + left - 1])) --left;
        if (left > 0) next.push_back({f.text.substr(at, left), -1});
        next.push_back({"", sp});
        at = hit + st.size();
        if (strip & kRstrip)
          while (at < f.text.size() && space(f.text[at])) ++at;
      }
      if (at < f.text.size()) next.push_back({f.text.substr(at), -1});
    }
    frags = std::move(next);
  }
  std::vector<int32_t> out;
  if (add_bos && bos_ >= 0) out.push_back(bos_);
  bool prev_special = true;
  for (const auto& f : frags) {
    if (f.special >= 0) {
      out.push_back(f.special);
      prev_special = true;
      continue;
    }
    if (f.text.empty()) continue;
    if (model_ == "gpt2") {
      for (const auto& w : pre_split(f.text)) bpe_word(w, out);
    } else {
      std::string s = (add_space_prefix_ && prev_special) ? " " + f.text : f.text;
      std::string esc;
      for (char c : s) esc += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      spm_text(esc, out);
      prev_special = false;
    }
  }
  return out;
}

std::string Tokenizer::piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) return "";
  const std::string& t = text_[id];
  int32_t type = type_[id];
  if (type == kControl || type == kUnknown) return special ? t : "";
  if (type == kUserDefined) return t;
  if (model_ == "gpt2") {
    std::string out;
    for (size_t o = 0; o < t.size();) {
      size_t n = utf8_len(static_cast<unsigned char>(t[o]));
      uint32_t cp = static_cast<unsigned char>(t[o]);
      if (n == 2 && o + 1 < t.size())
        cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(t[o + 1]) & 0x3F);
      auto it = codec().dec.find(cp);
      if (n <= 2 && it != codec().dec.end())
        out += static_cast<char>(it->second);
      else
        out += t.substr(o, n);
      o += n;
    }
    return out;
  }
  if (type == kByte && t.size() == 6)
    return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
  std::string out;
  for (size_t o = 0; o < t.size();) {
    if (t.compare(o, 3, "\xE2\x96\x81") == 0)
      out += ' ', o += 3;
    else
      out += t[o++];
  }
  return out;
}

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  // Find the last complete character boundary.
  size_t end = pending_.size(), i = pending_.size();
  size_t back = 0;
  while (i > 0 && back < 4) {
    --i;
    ++back;
    unsigned char c = static_cast<unsigned char>(pending_[i]);
    if ((c & 0xC0) != 0x80) {           // a lead byte (or ASCII)
      if (utf8_len(c) > back) end = i;  // incomplete
      break;
    }
  }
  std::string out = pending_.substr(0, end);
  pending_.erase(0, end);
  return out;
}

std::string Utf8Stream::flush() {
  return std::exchange(pending_, std::string());
}

}  // namespace engine
