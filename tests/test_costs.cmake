# The GoogleTest cases that take longest, with their seconds on a 2-core machine (the larger of
# the normal and the sanitizer build), read by CTest after it has loaded the discovered tests of
# tests/ and tests/simt/: `ctest -j` starts the costliest first, so that no long test is left
# running alone at the end. CTest learns costs itself (Testing/Temporary/CTestCostData.txt), but
# CI's clean clone has none and ran these late: replayed in this order, the logged times of
# CI's test phases come out 36 s (normal build) and 83 s (sanitizers) shorter. The mpirun and
# script tests set COST where they are added. A name missing here (a case the sanitizer build
# leaves out) is ignored by CTest.
set(zaya_test_costs
  emulated_wave64.GpuCca.Attention 150
  emulated.GpuCca.Attention 124
  emulated.GpuTraining.FiftyStepsMatchCpu 116
  TokenizerHfVariants.MatchHuggingFace 69
  "emulated.Modes/GpuMoe.WideShapesAndEdgeRoutings/bf16_grouped  # GetParam() = bf16_grouped" 31
  emulated.GpuModelGradsBf16.DecisiveRoutingGradientsMatchCpu 31
  Cli.TokenizeMatchesHuggingFaceIds 27
  SimtFlashAttention.TrainingChunksMatchTheCpuForwardAndBackward 26
  "emulated_wave64.Modes/GpuDense.LmHeadLoss/tiled_fp32  # GetParam() = tiled_fp32" 22
  "emulated_wave64.Modes/GpuDense.LmHeadLoss/bf16  # GetParam() = bf16" 22
  "emulated_wave64.Modes/GpuDense.LmHeadLoss/fp32  # GetParam() = fp32" 20
  "emulated.Modes/GpuDense.LmHeadLoss/tiled_fp32  # GetParam() = tiled_fp32" 20
  "emulated.Modes/GpuDense.LmHeadLoss/fp32  # GetParam() = fp32" 19
  "emulated.Modes/GpuDense.LmHeadLoss/bf16  # GetParam() = bf16" 19)

list(LENGTH zaya_test_costs zaya_test_costs_length)
math(EXPR zaya_test_costs_last "${zaya_test_costs_length} - 1")
foreach(i RANGE 0 ${zaya_test_costs_last} 2)
  math(EXPR j "${i} + 1")
  list(GET zaya_test_costs ${i} name)
  list(GET zaya_test_costs ${j} seconds)
  set_tests_properties("${name}" PROPERTIES COST ${seconds})
endforeach()
