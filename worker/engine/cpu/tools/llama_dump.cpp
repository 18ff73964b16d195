// llama_dump: run a prompt through the oracle's own llama.cpp (node-llama-cpp's prebuilt
// libllama + libggml, the CPU variant it would load) with the settings of
// fixtures/oracle/logprobs.mjs, and write llama.cpp's intermediate tensors and logits as
// JSONL, to find the first op where the CPU engine differs (compare with
// `worker-orcd generate --backend cpu --dump-checkpoints`). A debugging aid, not part of the
// build: it needs the git-ignored llama.cpp headers (.deps/llama.cpp, ci/setup.sh) and the
// npm package.
//
//   L=$PWD/fixtures/oracle/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
//   g++ -std=c++17 -O1 -I.deps/llama.cpp/include -I.deps/llama.cpp/ggml/include
//       worker/engine/cpu/tools/llama_dump.cpp -L$L -l:libllama.v0.4.0.so
//       -l:libggml.v0.4.0.so -l:libggml-base.so -Wl,-rpath,$L -o /tmp/llama_dump
//   (one command line)
//   /tmp/llama_dump MODEL.gguf 1,2,3 OUT.jsonl $L [TENSORS [GREEDY [KV]]]
//
// TENSORS: comma-separated graph tensor names (llama.cpp's cb() names, e.g.
// attn_norm-0,kqv_out-0,ffn_inp-0,l_out-1,result_norm; several ops can share a name and are
// all written, in graph order), or "list" to print every node's name, op and shape.
// ("none": no tensors). GREEDY N: afterwards decode N-1 greedy tokens one at a time (the
// one-token kernels), as `worker-orcd generate --n N --all-logits` does. KV: the K and V
// cache type, f16 (the default, llama.cpp's own default; compare with `generate --kv-cache f16`) or
// f32 (logprobs.mjs's setting, the CPU engine's default).
// Records: {"checkpoint": name, "values": [...]} per row, then {"token_idx": i, "values":
// logits} per position (prompt, then decode steps).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace {

std::ofstream* g_out = nullptr;
std::string g_want;

bool on_tensor(ggml_tensor* t, bool ask, void*) {
  if (g_want == "list") {
    if (!ask) {
      std::printf("%s %s [%ld,%ld,%ld]\n", t->name, ggml_op_desc(t), static_cast<long>(t->ne[0]),
                  static_cast<long>(t->ne[1]), static_cast<long>(t->ne[2]));
    }
    return true;
  }
  if (("," + g_want + ",").find("," + std::string(t->name) + ",") == std::string::npos)
    return false;
  if (ask) return true;
  if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
    std::printf("skipped %s (not a contiguous F32 tensor)\n", t->name);
    return true;
  }
  std::vector<float> buf(static_cast<size_t>(ggml_nelements(t)));
  ggml_backend_tensor_get(t, buf.data(), 0, buf.size() * sizeof(float));
  const int64_t ne0 = t->ne[0], rows = ggml_nelements(t) / ne0;
  char s[32];
  for (int64_t r = 0; r < rows; ++r) {
    *g_out << "{\"checkpoint\":\"" << t->name << "\",\"values\":[";
    for (int64_t j = 0; j < ne0; ++j) {
      std::snprintf(s, sizeof s, "%.9g",
                    static_cast<double>(buf[static_cast<size_t>(r * ne0 + j)]));
      *g_out << (j ? "," : "") << s;
    }
    *g_out << "]}\n";
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: %s MODEL.gguf TOKENS OUT.jsonl LIBDIR [TENSORS|list [GREEDY [f16|f32]]]\n",
                 argv[0]);
    return 2;
  }
  g_want = argc > 5 ? argv[5] : "result_norm";
  std::vector<llama_token> toks;
  for (const char* p = argv[2]; *p;) {
    char* end = nullptr;
    toks.push_back(static_cast<llama_token>(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end;
  }
  ggml_backend_load_all_from_path(argv[4]);  // picks the CPU variant as node-llama-cpp does
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) return 1;
  // logprobs.mjs: contextSize max(64, tokens + greedy + 8) (llama.cpp pads to 256), batchSize
  // max(64, tokens), 1 thread, F32 K and V cache (here: F16 unless KV is f32), no flash
  // attention.
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  while (cp.n_ctx < toks.size() + 8) cp.n_ctx += 256;
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(std::max<size_t>(64, toks.size()));
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  const std::string kv = argc > 7 ? argv[7] : "f16";
  if (kv != "f16" && kv != "f32") {
    std::fprintf(stderr, "KV must be f16 or f32, not %s\n", kv.c_str());
    return 2;
  }
  cp.type_k = cp.type_v = kv == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
  cp.cb_eval = on_tensor;
  std::ofstream out(argv[3]);
  g_out = &out;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  llama_batch b = llama_batch_init(static_cast<int32_t>(toks.size()), 0, 1);
  for (size_t i = 0; i < toks.size(); ++i) {
    b.token[i] = toks[i];
    b.pos[i] = static_cast<llama_pos>(i);
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = static_cast<int32_t>(toks.size());
  if (llama_decode(ctx, b) != 0) return 1;
  const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
  char s[32];
  auto write_logits = [&](size_t idx, const float* l) {
    out << "{\"token_idx\":" << idx << ",\"values\":[";
    for (int j = 0; j < nv; ++j) {
      std::snprintf(s, sizeof s, "%.9g", static_cast<double>(l[j]));
      out << (j ? "," : "") << s;
    }
    out << "]}\n";
  };
  for (size_t i = 0; i < toks.size(); ++i) {
    write_logits(i, llama_get_logits_ith(ctx, static_cast<int32_t>(i)));
  }
  const int greedy = argc > 6 ? std::atoi(argv[6]) : 0;
  const float* last = llama_get_logits_ith(ctx, static_cast<int32_t>(toks.size() - 1));
  for (int step = 1; step < greedy; ++step) {
    llama_token next = 0;
    for (int j = 1; j < nv; ++j) {
      if (last[j] > last[next]) next = j;
    }
    llama_batch one = llama_batch_get_one(&next, 1);
    if (llama_decode(ctx, one) != 0) return 1;
    last = llama_get_logits_ith(ctx, -1);
    write_logits(toks.size() + static_cast<size_t>(step) - 1, last);
  }
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
