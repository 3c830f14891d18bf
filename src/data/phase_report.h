// `zaya data stats --recipe`: the mixture-weighted totals of a phased curriculum. Per phase and
// dataset: the exact share of samples the mixture gives it, the tokens it contributes to the
// phase, the tokens its train split holds, and how many epochs of it that is.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/mixture.h"

namespace zaya {

struct PhaseMixtureRow {
  std::string phase, dataset;
  double share = 0;              // exact fraction of the phase's samples (per mixture block)
  double tokens = 0;             // tokens drawn in the phase (share x phase tokens)
  uint64_t available = 0;        // tokens in the dataset's train split
  double epochs = 0;             // tokens / available
};

// Opens every dataset's train split. last_phase_tokens: the token count assumed for an
// open-ended last phase (its budget is 0); 0 = report shares only.
std::vector<PhaseMixtureRow> phase_mixture(const std::vector<PhaseSpec>& phases, int64_t last_phase_tokens);
std::string format_phase_mixture(const std::vector<PhaseSpec>& phases, const std::vector<PhaseMixtureRow>& rows,
                                 int64_t last_phase_tokens);

}  // namespace zaya
