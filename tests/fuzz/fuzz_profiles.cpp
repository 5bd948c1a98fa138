// libFuzzer target: parse the bytes as every profile format from memory (names chosen so the
// shape parts of file names are valid), then build the profiled model and query it near the grid.
// Only packpipe's documented exception types may escape the library.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/errors.h"
#include "costmodel/profiled.h"

namespace {

using packpipe::costmodel::ProfileFormat;

const std::pair<ProfileFormat, const char*> kFormats[] = {
    {ProfileFormat::DynaPipeTiming, "gpt_6.7b_timing.csv"},
    {ProfileFormat::DynaPipeActivation, "gpt_6.7b_activation.csv"},
    {ProfileFormat::DynaPipeModelState, "gpt_6.7b_model_state.csv"},
    {ProfileFormat::DynaPipeMicrobench, "microbench_tp1_hs1024_ah128_kv128_ffhs65536_sl512_128_mbs2_rc_selective.txt"},
    {ProfileFormat::AcesoOps, "t5_770M_mbs1_tp1_algo0.csv"},
    {ProfileFormat::AcesoPrim, "prim_gpt_1_3B_all_reduce_2gpus.csv"},
    {ProfileFormat::AcesoP2P, "p2p_intra_node.csv"},
    {ProfileFormat::Metis, "DeviceType.A100_tp2_bs4_seq1024.json"},
    {ProfileFormat::Aiob, "llama_7b-tp2-mbs1-seq4096.txt"},
    {ProfileFormat::AicbLog, "A100_example.csv"},
    {ProfileFormat::Packpipe, "profile.json"},
};

const packpipe::costmodel::ModelSpec& t5() {
  static const packpipe::costmodel::ModelSpec m = packpipe::costmodel::load_model("t5-770m");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cm = packpipe::costmodel;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const auto& [format, name] : kFormats) {
    try {
      cm::Profile p = cm::parse_profile(format, text, name);
      if (p.points.empty()) continue;
      const cm::ProfiledCostModel model(std::move(p), t5(), cm::DeviceSpec{});
      for (const auto& pt : model.profile().points) {
        cm::Query q;
        q.kind = pt.kind;
        q.tp = pt.tp;
        q.recompute = pt.rc;
        q.mbs = pt.mbs + 1;
        q.seq = pt.seq + 1;
        q.dec_seq = pt.dec_seq + 1;
        try {
          (void)model.query(q);
        } catch (const packpipe::InvalidArgument&) {
        }
        break;
      }
    } catch (const packpipe::Error&) {
    } catch (const packpipe::InvalidArgument&) {
    } catch (const packpipe::OutOfRange&) {
    }
  }
  try {
    (void)cm::detect_profile_format("fuzz.txt", text);
  } catch (const packpipe::Error&) {
  }
  return 0;
}
