// hf-json: a Hugging Face tokenizer.json with a byte-level BPE model, mapped onto the same BPE
// engine as gguf-bpe. Supported pipeline: normalizer NFC (or none), pre_tokenizer
// Sequence[Split(<known regex>, Isolated), ByteLevel(use_regex=false)] or
// ByteLevel(use_regex=true), BPE model, added tokens. Anything else is refused by name.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("tokenizer.json '" + path + "': " + what);
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

// Returns true when NFC is applied; throws for unsupported normalizers.
bool parse_normalizer(const json& n, const std::string& path) {
  if (n.is_null()) return false;
  const std::string t = type_of(n);
  if (t == "NFC") return true;
  if (t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    bool nfc = false;
    for (const auto& item : n["normalizers"]) nfc = parse_normalizer(item, path) || nfc;
    return nfc;
  }
  fail(path, "unsupported normalizer type '" + t + "' (supported: NFC)");
}

PreTokenizer parse_pre_tokenizer(const json& p, const std::string& path) {
  const std::string t = type_of(p);
  auto byte_level_ok = [&](const json& b) {
    if (b.value("add_prefix_space", false)) {
      fail(path, "ByteLevel pre-tokenizer with add_prefix_space=true is not supported");
    }
  };
  if (t == "ByteLevel") {
    byte_level_ok(p);
    if (!p.value("use_regex", true)) fail(path, "ByteLevel(use_regex=false) without a Split");
    return PreTokenizer::kGpt2;
  }
  if (t != "Sequence" || !p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
    fail(path, "unsupported pre_tokenizer type '" + t + "'");
  }
  std::optional<PreTokenizer> result;
  bool byte_level = false;
  for (const auto& item : p["pretokenizers"]) {
    const std::string it = type_of(item);
    if (it == "Split") {
      if (result) fail(path, "more than one Split pre-tokenizer");
      const json& pat = item.value("pattern", json::object());
      if (!pat.contains("Regex") || !pat["Regex"].is_string()) {
        fail(path, "Split pre-tokenizer without a Regex pattern");
      }
      if (item.value("behavior", std::string()) != "Isolated" || item.value("invert", false)) {
        fail(path, "Split pre-tokenizer behavior must be Isolated (not inverted)");
      }
      const std::string regex = pat["Regex"].get<std::string>();
      result = pre_tokenizer_from_regex(regex);
      if (!result) fail(path, "unsupported Split regex (no hand-written splitter): " + regex);
    } else if (it == "ByteLevel") {
      byte_level_ok(item);
      if (item.value("use_regex", true)) {
        if (result) fail(path, "ByteLevel(use_regex=true) after a Split is not supported");
        result = PreTokenizer::kGpt2;
      }
      byte_level = true;
    } else {
      fail(path, "unsupported pre-tokenizer '" + it + "' in Sequence");
    }
  }
  if (!byte_level)
    fail(path, "pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  if (!result) fail(path, "pre_tokenizer has no split step");
  return *result;
}

std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return {};
}

class HfJsonTokenizer : public BpeTokenizer {
 public:
  HfJsonTokenizer(VocabSpec spec, PreTokenizer pre, bool nfc, bool clean_spaces)
      : BpeTokenizer(std::move(spec), "hf-json", pre,
                     nfc ? std::function<std::string(std::string_view)>(unicode::nfc) : nullptr) {
    vocab_.set_clean_spaces(clean_spaces);
  }
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_json_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open file");
  std::stringstream content;
  content << in.rdbuf();
  std::string config;
  const auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    std::ifstream cin(cfg_path, std::ios::binary);
    std::stringstream ss;
    ss << cin.rdbuf();
    config = ss.str();
  }
  return load_hf_json_tokenizer_from_string(content.str(), config, path);
}

namespace {
std::unique_ptr<Tokenizer> build_from_json(const json& j, std::string_view config_json,
                                           const std::string& path);
}  // namespace

std::unique_ptr<Tokenizer> load_hf_json_tokenizer_from_string(std::string_view content,
                                                              std::string_view config_json,
                                                              const std::string& path) {
  json j;
  try {
    j = json::parse(content);
  } catch (const json::exception& e) {
    fail(path, std::string("invalid JSON: ") + e.what());
  }
  try {
    return build_from_json(j, config_json, path);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    fail(path, std::string("malformed: ") + e.what());
  }
}

namespace {
std::unique_ptr<Tokenizer> build_from_json(const json& j, std::string_view config_json,
                                           const std::string& path) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) fail(path, "no model");
  const json& model = j["model"];
  if (type_of(model) != "BPE")
    fail(path, "unsupported model type '" + type_of(model) + "' (BPE only)");
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail(path, "model.vocab missing");
  if (!model.contains("merges") || !model["merges"].is_array()) fail(path, "model.merges missing");

  VocabSpec spec;
  spec.model = "gpt2";
  spec.name = "hf-json";
  std::vector<std::pair<int64_t, std::string>> entries;
  int64_t max_id = -1;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > 2'000'000) {
      fail(path, "bad id for vocab entry '" + text + "'");
    }
    entries.emplace_back(id.get<int64_t>(), text);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  struct Added {
    int64_t id;
    std::string text;
    bool special, lstrip, rstrip;
  };
  std::vector<Added> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        fail(path, "malformed added_tokens entry");
      }
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > 2'000'000) fail(path, "bad added token id " + std::to_string(id));
      added.push_back(Added{id, a["content"].get<std::string>(), a.value("special", false),
                            a.value("lstrip", false), a.value("rstrip", false)});
      max_id = std::max(max_id, id);
    }
  }
  if (max_id < 0) fail(path, "empty vocabulary");
  const auto n = static_cast<size_t>(max_id + 1);
  spec.tokens.assign(n, std::string());
  spec.token_types.assign(n, static_cast<int32_t>(TokenType::kUnused));
  for (const auto& [id, text] : entries) {
    spec.tokens[static_cast<size_t>(id)] = text;
    spec.token_types[static_cast<size_t>(id)] = static_cast<int32_t>(TokenType::kNormal);
  }
  if (!added.empty()) spec.extra_attrs.assign(n, 0);
  for (const Added& a : added) {
    spec.extra_attrs[static_cast<size_t>(a.id)] =
        (a.lstrip ? static_cast<uint32_t>(kAttrLstrip) : 0u) |
        (a.rstrip ? static_cast<uint32_t>(kAttrRstrip) : 0u);
    spec.tokens[static_cast<size_t>(a.id)] = a.text;
    spec.token_types[static_cast<size_t>(a.id)] =
        static_cast<int32_t>(a.special ? TokenType::kControl : TokenType::kUserDefined);
  }
  for (const auto& m : model["merges"]) {
    if (m.is_string()) {
      spec.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      fail(path, "malformed merges entry");
    }
  }

  const bool nfc = parse_normalizer(j.value("normalizer", json()), path);
  const PreTokenizer pre = parse_pre_tokenizer(j.value("pre_tokenizer", json()), path);
  spec.pre = pre_tokenizer_name(pre);

  // BOS from a TemplateProcessing post-processor that starts with a special token.
  const json post = j.value("post_processor", json());
  bool add_bos = false;
  std::string bos_text;
  if (type_of(post) == "TemplateProcessing" && post.contains("single") &&
      post["single"].is_array() && !post["single"].empty()) {
    const json& first = post["single"][0];
    if (first.contains("SpecialToken")) {
      add_bos = true;
      bos_text = first["SpecialToken"].value("id", std::string());
    }
  }

  // tokenizer_config.json next to it: EOS/BOS texts, chat template, clean-up flag.
  bool clean = false;
  std::string eos_text;
  if (!config_json.empty()) {
    json cfg = json::parse(config_json, nullptr, false);
    if (cfg.is_object()) {
      eos_text = token_text(cfg.value("eos_token", json()));
      if (bos_text.empty()) bos_text = token_text(cfg.value("bos_token", json()));
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
        add_bos = cfg["add_bos_token"].get<bool>();
      }
      clean = cfg.value("clean_up_tokenization_spaces", false);
      if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
        spec.chat_template = cfg["chat_template"].get<std::string>();
      }
    }
  }
  auto id_of = [&](const std::string& t) -> std::optional<int64_t> {
    if (t.empty()) return std::nullopt;
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      if (spec.tokens[i] == t) return static_cast<int64_t>(i);
    }
    return std::nullopt;
  };
  spec.bos_id = id_of(bos_text);
  spec.eos_id = id_of(eos_text);
  // BPE defaults (id 11) must not leak in: mark absent ids out of range.
  if (!spec.bos_id) spec.bos_id = -1;
  if (!spec.eos_id) spec.eos_id = -1;
  spec.add_bos = add_bos && spec.bos_id >= 0;
  return std::make_unique<HfJsonTokenizer>(std::move(spec), pre, nfc, clean);
}

}  // namespace

}  // namespace worker
