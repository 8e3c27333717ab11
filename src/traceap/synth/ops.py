"""Layer -> aten ops -> kernels, with the names PyTorch, cuDNN, cuBLAS/CUTLASS and Triton write.

Every kernel and op name here was read from real Kineto traces (../shared/traces: a DDP CNN on
A100, a Particle Transformer on A100, BERT and Qwen on H100, Triton and NCCL traces) or from
PyTorch's own naming (autograd node names, `aten::` schema names, record_function labels).
A `Layer` names an op template and its work per sample; `op_plan` turns it into the forward
and backward `OpCall`s the simulator executes, with kernel durations from the platform.
"""

from __future__ import annotations

from dataclasses import dataclass

from .platforms import Platform

# -- scalar type spellings, as they appear inside templated kernel names --------------------
_CT = {"fp32": "float", "fp16": "c10::Half", "bf16": "c10::BFloat16"}     # ATen
_NT = {"fp32": "float", "fp16": "__half", "bf16": "__nv_bfloat16"}       # cuDNN
_LAMBDA = {"fp32": "{lambda()#7}", "fp16": "{lambda()#10}", "bf16": "{lambda()#12}"}


def _vec(functor: str, arity: int, dt: str) -> str:
    """`vectorized_elementwise_kernel` with a plain functor (ATen's TensorIterator path)."""
    return (f"void at::native::vectorized_elementwise_kernel<4, {functor}, "
            f"at::detail::Array<char*, {arity}> >(int, {functor}, at::detail::Array<char*, {arity}>)")


def _lam(outer: str, dt: str, arity: int, extra: str = "") -> str:
    """`vectorized_elementwise_kernel` around a dispatch lambda, as nvcc names it."""
    lam = (f"{outer}::{{lambda()#1}}::operator()() const::{_LAMBDA[dt]}::operator()() const::"
           f"{{lambda({_CT[dt]}{extra})#1}}")
    return (f"void at::native::vectorized_elementwise_kernel<4, {lam}, at::detail::Array<char*, "
            f"{arity}> >(int, {lam}, at::detail::Array<char*, {arity}>)")


def elementwise(kind: str, dt: str) -> str:
    """Name of an ATen elementwise kernel of one kind (add, mul, relu, ...) in a dtype."""
    c = _CT[dt]
    if kind == "add":
        return _vec(f"at::native::CUDAFunctor_add<{c}>", 3, dt)
    if kind == "add_":
        return _vec(f"at::native::CUDAFunctorOnSelf_add<{c}>", 2, dt)
    if kind == "add_long":
        return _vec("at::native::CUDAFunctorOnSelf_add<long>", 2, dt)
    if kind == "mul_scalar":
        return _vec(f"at::native::AUnaryFunctor<{c}, {c}, {c}, "
                    f"at::native::binary_internal::MulFunctor<float> >", 2, dt)
    if kind == "mul":
        return _vec(f"at::native::BinaryFunctor<{c}, {c}, {c}, "
                    f"at::native::binary_internal::MulFunctor<float> >", 3, dt)
    if kind == "div":
        return _vec(f"at::native::BinaryFunctor<{c}, {c}, {c}, "
                    f"at::native::binary_internal::DivFunctor<float> >", 3, dt)
    if kind == "fill":
        return _vec(f"at::native::FillFunctor<{c}>", 1, dt)
    if kind == "relu":
        return _lam("at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, "
                    "c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)", dt, 2)
    if kind == "relu_bw":
        f = (f"at::native::BinaryFunctor<{c}, {c}, {c}, at::native::(anonymous namespace)::"
             f"threshold_kernel_impl<{c}>(at::TensorIteratorBase&, {c}, {c})::"
             f"{{lambda({c}, {c})#1}}>")
        return _vec(f, 3, dt)
    if kind == "gelu":
        return _lam("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)",
                    dt, 2).replace("{lambda()#1}", "{lambda()#2}", 1)
    if kind == "gelu_bw":
        return _lam("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
                    "at::native::GeluType)", dt, 3, f", {c}").replace("{lambda()#1}",
                                                                      "{lambda()#2}", 1)
    if kind == "silu":
        return _lam("at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)",
                    dt, 2)
    if kind == "silu_bw":
        return _lam("at::native::(anonymous namespace)::silu_backward_kernel("
                    "at::TensorIteratorBase&)", dt, 3, f", {c}")
    if kind == "sigmoid":
        return _lam("at::native::sigmoid_kernel_cuda(at::TensorIteratorBase&)", dt, 2)
    if kind == "copy":  # dtype casts (autocast's aten::to)
        return ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
                "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
                f"{_LAMBDA[dt]}::operator()() const::{{lambda({c})#1}}, at::detail::Array<char*, 2>, "
                "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
                "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, "
                "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
                f"const::{_LAMBDA[dt]}::operator()() const::{{lambda({c})#1}}, at::detail::Array<char*, 2>, "
                "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
                "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)")
    if kind == "cat":
        return ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<"
                "at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 4, 128, 1>("
                "at::native::(anonymous namespace)::OpaqueType<4u>*, at::native::(anonymous namespace)::"
                "CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned "
                "int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, "
                "int, unsigned int)")
    if kind == "sum":
        return ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::"
                "func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()("
                "at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >("
                "at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::"
                "sum_functor<float, float, float>::operator()(at::TensorIterator&)::"
                "{lambda(float, float)#1}>, unsigned int, float, 4>)")
    if kind == "mean":
        return ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::"
                "MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp"
                "<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)")
    if kind == "index":
        return ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
                "at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, "
                "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>("
                "at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::"
                "index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, "
                "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} "
                "const&)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<at::native::"
                "index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, "
                "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>("
                "at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::"
                "index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, "
                "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} "
                "const&)::{lambda(int)#1})")
    raise KeyError(kind)


#: cuBLAS SIMT sgemm kernels (fp32 matmul with TF32 off, PyTorch's default for matmul) and the
#: split-K reduction cuBLAS adds for tall-K shapes; names read from A100 traces (HTA, PARAM).
_SGEMM = ("ampere_sgemm_128x64_tn", "ampere_sgemm_32x32_sliced1x4_tn", "ampere_sgemm_128x32_nn",
          "ampere_sgemm_64x32_sliced1x4_nt", "ampere_sgemm_32x128_nt", "ampere_sgemm_128x128_tn",
          "ampere_sgemm_64x64_nn", "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>("
          "cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)")
SPLITK_REDUCE = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, "
                 "true, false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, "
                 "float*, float const*, float const*, float const*, float const*, float*, void*, "
                 "long, float*, int*)")
GEMV = ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, "
        "float, false, true, true, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float "
        "const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float> >(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)")
#: cuBLAS 12.8+ "nvjet" GEMMs on Hopper/Blackwell (names read from an H100/B200 trace).
_NVJET = ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_TNT", "nvjet_tst_144x128_64x6_2x1_v_bz_TNN",
          "nvjet_tst_64x16_64x16_2x4_2cta_h_bz_TNT", "nvjet_tst_192x8_64x8_4x1_v_bz_TNT")


def gemm(dt: str, p: Platform, variant: int, layout: str = "tn", tf32: bool = True) -> str:
    """A cuBLAS / CUTLASS GEMM kernel name for a dtype on a platform.

    `variant` picks among the kernels cuBLAS's heuristics choose for different shapes (any
    int); fp32 without TF32 (`torch.backends.cuda.matmul.allow_tf32 = False`, the default for
    matmul) runs SIMT sgemm kernels, with TF32 CUTLASS tensor-op ones.
    """
    v = variant % 3
    if p.sm_tag == "sm90":
        if variant % 5 == 4 and dt != "fp32":
            return _NVJET[(variant // 5) % len(_NVJET)]
        if dt == "fp32":
            tile = ("128x128x32", "64x128x32", "256x128x32")[v]
            return (f"sm90_xmma_gemm_f32f32_tf32f32_f32_{layout}_n_tilesize{tile}_warpgroupsize1x1x1_"
                    f"execute_segment_k_off_kernel__5x_cublas")
        tile = ("128x128x64", "64x64x64", "128x256x64")[v]
        return (f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_{layout}_n_tilesize{tile}_warpgroupsize1x1x1_"
                f"execute_segment_k_off_kernel__5x_cublas")
    if dt == "fp32":
        if not tf32:
            name = _SGEMM[variant % len(_SGEMM)]
            return name[:-2] + layout if name.startswith("ampere_sgemm") else name
        tile = ("256x64_16x4", "64x64_16x6", "128x128_16x5")[v]
        k = f"cutlass_80_tensorop_s1688gemm_{tile}_{layout}_align4"
        return f"void cutlass::Kernel<{k}>({k}::Params)"
    if dt == "fp16":
        return ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_" + layout,
                "ampere_fp16_s16816gemm_fp16_64x64_ldg8_f2f_stages_64x5_" + layout,
                "ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_" + layout,
                "ampere_fp16_s1688gemm_fp16_128x128_ldg8_f2f_stages_32x1_" + layout)[variant % 4]
    tile = ("64x64_64x6", "256x128_64x3", "128x128_64x4")[v]
    k = f"cutlass_80_tensorop_bf16_s16816gemm_bf16_{tile}_{layout}_align8"
    return f"void cutlass::Kernel2<{k}>({k}::Params)"


def conv(kind: str, dt: str, p: Platform, variant: int, channels_last: bool) -> str:
    """A cuDNN implicit-GEMM convolution kernel (fprop / dgrad / wgrad)."""
    if p.sm_tag == "sm90":
        t = "bf16bf16_bf16f32_f32" if dt != "fp32" else "tf32f32_tf32f32_f32"
        tile = ("128x128x64", "64x128x64", "128x256x64")[variant % 3]
        return (f"sm90_xmma_{kind}_implicit_gemm_{t}_nhwckrsc_nhwc_tilesize{tile}_warpgroupsize1x1x1_"
                f"g1_execute_segment_k_off_kernel__5x_cudnn")
    if dt == "fp32":
        t, tensor = "tf32f32_tf32f32_f32", "tensor16x8x8"
    else:
        t = "f16f16_f16f32_f32" if dt == "fp16" else "bf16bf16_bf16f32_f32"
        tensor = "tensor16x8x16"
    tile = ("128x128x16_stage4_warpsize2x2x1", "64x128x32_stage5_warpsize2x2x1",
            "256x64x32_stage3_warpsize4x2x1")[variant % 3]
    idx = "indexed_" if kind == "wgrad" or variant % 2 else ""
    out = "nhwc" if channels_last or kind != "fprop" else "nchw"
    lib = "cudnn_train" if kind == "wgrad" else "cudnn_infer"
    return (f"sm80_xmma_{kind}_implicit_gemm_{idx}{t}_nhwckrsc_{out}_tilesize{tile}_g1_{tensor}_"
            f"execute_kernel_{lib}")


#: The split-K reduction and NCHW weight-gradient helper cuDNN runs after some wgrad kernels.
_REDUCE_SPLITK = ("void cutlass_cudnn_train::Kernel<cutlass_cudnn_train::reduction::kernel::ReduceSplitK<"
                  "cutlass_cudnn_train::MatrixShape<4, 128>, cutlass_cudnn_train::epilogue::thread::"
                  "LinearCombination<float, 4, float, float, (cutlass_cudnn_train::epilogue::thread::"
                  "ScaleType::Kind)0, (cutlass_cudnn_train::FloatRoundStyle)2>, cutlass_cudnn_train::"
                  "reduction::thread::ReduceAdd<float, float, 4>, 4> >(cutlass_cudnn_train::reduction::"
                  "kernel::ReduceSplitK<cutlass_cudnn_train::MatrixShape<4, 128>, cutlass_cudnn_train::"
                  "epilogue::thread::LinearCombination<float, 4, float, float, (cutlass_cudnn_train::"
                  "epilogue::thread::ScaleType::Kind)0, (cutlass_cudnn_train::FloatRoundStyle)2>, "
                  "cutlass_cudnn_train::reduction::thread::ReduceAdd<float, float, 4>, 4>::Params)")
_REDUCE_WGRAD_NCHW = ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(void*, void const*, float, "
                      "int, int)")
#: CUTLASS implicit-GEMM wgrad as cuDNN ships it (an unmangled name is never written for it).
_MANGLED_WGRAD = (
    "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22"
    "ImplicitGemmMultistageINS_4gemm9GemmShapeILi{m}ELi128ELi32EEENS4_52Conv2dWgradOutputGradient"
    "TileAccessIteratorOptimizedINS_11MatrixShapeILi{m}ELi32EEENS_10tfloat32_tENS_9transform29"
    "PitchLinearWarpRakedThreadMapINS_16PitchLinearShapeILi{m}ELi32EEELi128ENSF_ILi8ELi4EEELi4EEENS_"
    "12AlignedArrayISC_Li4ELi16EEEEENSD_11threadblock25RegularTileAccessIteratorISB_SC_NS_6layout40"
    "ColumnMajorTensorOpMultiplicandCongruousILi32ELi32EEELi1ESI_Li16EEELNS_4arch14CacheOperation4"
    "KindE0ENS4_48Conv2dWgradActivationTileAccessIteratorOptimizedINSA_ILi32ELi128EEESC_SI_SK_EENSN_"
    "ISW_SC_NSO_37RowMajorTensorOpMultiplicandCongruousILi32ELi32EEELi0ESI_Li16EEELSU_0ENS6_11thread"
    "block9MmaPolicyINS6_4warp11MmaTensorOpINS7_ILi64ELi64ELi32EEESC_SQ_SC_SZ_fNSO_8RowMajorENS13_17"
    "MmaTensorOpPolicyINSS_3MmaINS7_ILi16ELi8ELi8EEELi32ESC_S16_SC_NSO_11ColumnMajorEfS16_NSS_13Op"
    "MultiplyAddEEENSA_ILi1ELi1EEEEELi1ELb0EbEENSA_ILi0ELi0EEES1G_Li1EEELi4EbEENS_8epilogue11thread"
    "block8EpilogueIS8_S1F_Li1ENS1K_22PredicatedTileIteratorINS1K_26OutputTileOptimalThreadMapINS1K_"
    "15OutputTileShapeILi128ELi8ELi2ELi1ELi1EEENS1O_ILi1ELi8ELi1ELi1ELi8EEELi128ELi4ELi32EEEfLb0ENSO_"
    "9NoPermuteELb0EEENS1J_4warp24FragmentIteratorTensorOpIS15_S19_fNS_5ArrayIfLi4ELb1EEES16_EENS1U_"
    "20TileIteratorTensorOpIS15_S19_fS16_EENS1K_18SharedLoadIteratorINS1R_18CompactedThreadMapEfLi16"
    "EEENS1J_6thread17LinearCombinationIfLi4EffLNS24_9ScaleType4KindE0ELNS_15FloatRoundStyleE2EEENSA_"
    "ILi0ELi8EEELi2ELi1EEENS11_30GemmIdentityThreadblockSwizzleILi4EEELNS1_8OperatorE2ENS1_17Conv2d"
    "ProblemSizeELNS1_9GroupModeE0EEEEEvNT_6ParamsE")
_STEM = ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1",
         "void cask_cudnn_infer::computeOffsetsKernel<false, false>(cask_cudnn_infer::ComputeOffsetsParams)")
_CUTLASS_CONV_TILES = {
    "fprop": ("128x128_32x4", "128x128_16x4", "256x64_32x3"),
    "dgrad": ("64x128_32x3", "128x128_16x4", "64x256_32x4", "64x256_16x4", "256x64_16x4"),
    "wgrad": ("256x128_16x3", "256x64_16x4", "128x128_32x3"),
}


def _cutlass_conv(kind: str, dt: str, tile: str, unity: bool) -> str:
    """cuDNN's CUTLASS convolution kernels (`cutlass_cudnn_{infer,train}::Kernel<...>`)."""
    ns = "cutlass_cudnn_train" if kind == "wgrad" else "cutlass_cudnn_infer"
    if dt == "fp32":
        stride = "_unity_stride" if unity else ""
        k = f"cutlass_tensorop_s1688{kind}_optimized_tf32_{tile}_nhwc{stride}_align4"
    else:
        t = "f16" if dt == "fp16" else "bf16"
        k = f"cutlass_tensorop_{t}_s16816{kind}_optimized_{t}_{tile}_nhwc_align8"
    return f"void {ns}::Kernel<{k}>({k}::Params)"


def conv_kernels(kind: str, dt: str, p: Platform, layer: "Layer", channels_last: bool,
                 algo: int = 0) -> list[tuple[str, float, bool]]:
    """The kernels cuDNN runs for one convolution pass: (name, share of the work, memory bound).

    cuDNN picks per shape among implicit-GEMM xmma kernels, CUTLASS convolutions, plain GEMMs
    for 1x1 convolutions and (for the 3-channel stem) scudnn kernels, with split-K reductions
    after some weight gradients; the mix follows the A100 DDP CNN trace of HTA.  `algo` is a
    per-run salt (cuDNN version, benchmark-mode choices) so one model differs across runs.
    """
    pick = (layer.variant * 7 + int(layer.gflop * 1e3) + int(layer.act_mb * 10) + algo) & 0xFFFF
    if p.sm_tag == "sm90":
        if layer.shape == 1 and pick % 3 != 0:
            lay = {"fprop": "nn", "dgrad": "nt", "wgrad": "tn"}[kind]
            return [(gemm(dt, p, pick, lay), 1.0, False)]
        return [(conv(kind, dt, p, pick, channels_last), 1.0, False)]
    if kind == "fprop" and 0 < layer.cin <= 4 and dt == "fp32":
        return [(_STEM[1], 0.02, True), (_STEM[0], 0.98, False)]
    if layer.shape == 1 and pick % 5 < 3:
        lay = {"fprop": "nn", "dgrad": "nt", "wgrad": "tn"}[kind]
        return [(gemm(dt, p, pick, lay, tf32=True), 1.0, False)]
    r = pick % 10
    if kind == "wgrad":
        if r < 4:
            out = [(conv(kind, dt, p, pick, channels_last), 1.0, False)]
        elif r < 7 and dt == "fp32":
            m = 128 if pick % 2 else 64
            out = [(_MANGLED_WGRAD.format(m=m), 0.93, False), (_REDUCE_SPLITK, 0.07, True)]
        else:
            tiles = _CUTLASS_CONV_TILES[kind]
            out = [(_cutlass_conv(kind, dt, tiles[pick % len(tiles)], False), 1.0, False)]
        if not channels_last and dt == "fp32" and pick % 3 == 0:
            out.append((_REDUCE_WGRAD_NCHW, 0.03, True))
        return out
    if r < 5:
        return [(conv(kind, dt, p, pick, channels_last), 1.0, False)]
    tiles = _CUTLASS_CONV_TILES[kind]
    return [(_cutlass_conv(kind, dt, tiles[pick % len(tiles)], kind == "dgrad" and pick % 2 == 0),
             1.0, False)]


def cudnn_transpose(to_nhwc: bool, dt: str) -> str:
    """cuDNN's layout transposes around convolutions of NCHW tensors."""
    n = _NT[dt]
    if to_nhwc:
        return (f"void cudnn::ops::nchwToNhwcKernel<{n}, {n}, float, false, true, "
                f"(cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, {n} const*, {n}*)")
    return (f"void cudnn::ops::nhwcToNchwKernel<{n}, {n}, float, true, false, "
            f"(cudnnKernelDataType_t)0>(cudnn::ops::nhwc2nchw_params_t<float>, {n} const*, {n}*)")


def batchnorm(fwd: bool, dt: str, channels_last: bool, variant: int) -> str:
    """cuDNN batch-norm training kernels (NCHW and NHWC single-read forms)."""
    n = _NT[dt]
    if channels_last:
        return (f"void cudnn::bn_fw_tr_1C11_singleread<{n}, 512, true, 1, 2, 0>(cudnn::"
                f"bn_fw_tr_1C11_args<{n}>)" if fwd else
                f"void cudnn::bn_bw_1C11_singleread<{n}, 512, true, 1, 2, 0>(cudnn::"
                f"bn_bw_1C11_args<{n}>)")
    w = (32, 128, 512)[variant % 3]
    if fwd:
        return (f"void cudnn::bn_fw_tr_1C11_kernel_NCHW<{n}, float, int, {w}, true, 1, true>("
                f"cudnnTensorStruct, {n} const*, cudnnTensorStruct, {n}*, float const*, float const*, "
                f"float, float, float*, float*, float*, float*, float, float)")
    return (f"void cudnn::bn_bw_1C11_kernel_new<{n}, float, float2, {w}, true, 1>(float, float, "
            f"float, float, cudnnTensorStruct, {n} const*, cudnnTensorStruct, {n} const*, "
            f"cudnnTensorStruct, {n}*, float const*, float*, float*, float const*, float const*, float)")


def layernorm(kind: str, dt: str) -> str:
    """ATen layer-norm kernels."""
    c = _CT[dt]
    if kind == "fwd":
        return (f"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<{c}, float>("
                f"int, float, {c} const*, {c} const*, {c} const*, float*, float*, {c}*)")
    if kind == "bwd_input":
        return (f"void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<"
                f"{c}, float>({c} const*, {c} const*, float const*, float const*, {c} const*, {c}*, int)")
    return (f"void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<{c}, float, "
            f"32u, 32u, 256u, false, true>(long, long, {c} const*, {c} const*, float const*, "
            f"float const*, {c}*, {c}*)")


def groupnorm(fwd: bool, dt: str) -> str:
    """ATen group-norm kernels (diffusion UNets)."""
    c = _CT[dt]
    if fwd:
        return (f"void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<{c}>(long, "
                f"{c}, {c} const*, {c}*, {c}*)")
    return (f"void at::native::(anonymous namespace)::ComputeInternalGradientsCUDAKernel<{c}>("
            f"long, {c} const*, {c} const*, {c}*, {c}*)")


def flash(kind: str, dt: str) -> str:
    """PyTorch's bundled FlashAttention-2 kernels (SDPA)."""
    t = "cutlass::bfloat16_t" if dt == "bf16" else "cutlass::half_t"
    if kind == "fwd":
        return (f"void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, "
                f"128, 128, 4, false, false, {t}, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
                f"{t}> >, false, false, false, false, false, true, false>(pytorch_flash::Flash_fwd_params)")
    if kind == "bwd_dot":
        return (f"void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::"
                f"Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, {t}, "
                f"pytorch_flash::Flash_kernel_traits<64, 128, 128, 8, {t}> > >(pytorch_flash::"
                f"Flash_bwd_params)")
    if kind == "bwd_main":
        return (f"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::"
                f"Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, {t}, "
                f"pytorch_flash::Flash_kernel_traits<64, 128, 128, 8, {t}> >, false, false, false, "
                f"false, false, false>(pytorch_flash::Flash_bwd_params)")
    return (f"void pytorch_flash::flash_bwd_convert_dq_kernel<pytorch_flash::Flash_bwd_kernel_traits"
            f"<64, 128, 128, 8, 2, 4, 2, false, false, {t}, pytorch_flash::Flash_kernel_traits<64, "
            f"128, 128, 8, {t}> > >(pytorch_flash::Flash_bwd_params, int)")


def mem_efficient(fwd: bool) -> str:
    """xFormers-style memory-efficient attention kernels (SDPA's fp32 path)."""
    if fwd:
        return ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
                "float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)")
    return ("fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel"
            "<cutlass::arch::Sm80, float, true, false, true, 64, 64, 64, false>::Params)")


def softmax(fwd: bool, dt: str) -> str:
    """ATen softmax kernels (classification heads, attention in eager fp32)."""
    c = _CT[dt]
    if fwd:
        return (f"void (anonymous namespace)::softmax_warp_forward<{c}, {c}, float, 10, true, false>("
                f"{c}*, {c} const*, int, int, int, bool const*, int, bool)")
    return (f"void (anonymous namespace)::softmax_warp_backward<{c}, {c}, float, 10, true, false>("
            f"{c}*, {c} const*, {c} const*, int, int, int, bool const*)")


def pooling(kind: str, dt: str) -> str:
    """Max-pool / adaptive-avg-pool / upsample kernels."""
    c = _CT[dt]
    if kind == "max_fwd":
        return (f"void at::native::(anonymous namespace)::max_pool_forward_nchw<{c}>(int, {c} const*, "
                f"long, long, long, int, int, int, int, int, int, int, int, int, int, {c}*, long*)")
    if kind == "max_bwd":
        return (f"void at::native::(anonymous namespace)::max_pool_backward_nchw<{c}>({c} const*, "
                f"long const*, int, long, long, long, int, int, int, int, int, int, int, int, int, "
                f"int, {c}*)")
    if kind == "avg_fwd":
        return (f"void at::native::(anonymous namespace)::adaptive_average_pool<{c}>({c}*, {c}*, int, "
                f"int, int, int, long, long, long)")
    if kind == "avg_bwd":
        return (f"void at::native::(anonymous namespace)::atomic_adaptive_average_gradinput<{c}>("
                f"{c}*, {c}*, int, int, int, int)")
    if kind == "up_fwd":
        return (f"void at::native::(anonymous namespace)::upsample_bilinear2d_out_frame<{c}, float>("
                f"int, float, float, bool, at::GenericPackedTensorAccessor<{c} const, 4ul, "
                f"at::DefaultPtrTraits, long>, at::GenericPackedTensorAccessor<{c}, 4ul, "
                f"at::DefaultPtrTraits, long>)")
    return (f"void at::native::(anonymous namespace)::upsample_bilinear2d_backward_out_frame<{c}, "
            f"float>(unsigned long, int, int, int, int, int, int, float, float, bool, {c}*, {c} const*)")


def loss_kernels(dt: str) -> tuple[str, str, str, str]:
    """Cross-entropy forward (log_softmax, nll) and backward kernels."""
    return (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        "void nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, "
        "long const*, float const*, bool, long, long, long, long)",
        "void nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, float const*, long const*, "
        "float const*, float const*, bool, int, int, long, long)",
        "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, "
        "float const*, long)",
    )


def foreach(kind: str) -> str:
    """multi_tensor_apply kernels of the foreach / fused optimizers."""
    if kind == "adam":
        return ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
                "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, "
                "double, double, double, double, double, bool, float*, float*>(at::native::"
                "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
                "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, "
                "double, double, double, double, double, bool, float*, float*)")
    if kind == "add_list":
        return ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
                "BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::"
                "(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
                "BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)")
    if kind == "mul_scalar":
        return ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
                "BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float>(at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
                "BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float)")
    if kind == "zero":
        return ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
                "ZeroFunctor<float, 1, 1, 0>>(at::native::(anonymous namespace)::"
                "TensorListMetadata<1>, at::native::(anonymous namespace)::"
                "ZeroFunctor<float, 1, 1, 0>)")
    if kind == "add_scalar":
        return ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
                "BinaryOpScalarFunctor<float, 1, 1, 0>, std::plus<float>, float>(at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
                "BinaryOpScalarFunctor<float, 1, 1, 0>, std::plus<float>, float)")
    raise KeyError(kind)


#: NCCL kernel naming dialects by library version (names read from real traces and reports):
#: 2.19+ `ncclDevKernel_<Coll>_<Op>_<type>_<ALGO>_<PROTO>(ncclDevKernelArgsStorage<4096ul>)`,
#: 2.12-2.18 `ncclKernel_<Coll>_<ALGO>_<PROTO>_<Op>_<type>(ncclDevComm*, unsigned long, ncclWork*)`,
#: 2.8-2.11 the same with `(ncclWorkElem)`.
NCCL_VERSIONS = ("2.21.5", "2.19.3", "2.18.1", "2.14.3", "2.10.3")
_NCCL_NEW_T = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "i8": "i8"}
_NCCL_OLD_T = {"fp32": "float", "fp16": "half", "bf16": "bfloat16", "i8": "int8_t"}


def nccl_protocol(nbytes: float, ll_max: float = 64 * 1024, ll128_max: float = 8 * 2**20) -> str:
    """The protocol NCCL's tuner picks by message size (thresholds depend on topology/version)."""
    return "LL" if nbytes < ll_max else ("LL128" if nbytes < ll128_max else "SIMPLE")


def nccl_kernel(coll: str, dt: str, proto: str, version: str = "2.21.5", algo: str = "RING") -> str:
    """An NCCL collective kernel name (coll: AllReduce, Broadcast, AllGather, ReduceScatter)."""
    major = tuple(int(x) for x in version.split(".")[:2])
    op = "Sum"
    if major >= (2, 19):
        t = _NCCL_NEW_T[dt]
        mid = f"{op}_{t}_" if coll in ("AllReduce", "ReduceScatter", "Reduce") else ""
        return f"ncclDevKernel_{coll}_{mid}{algo}_{proto}(ncclDevKernelArgsStorage<4096ul>)"
    t = _NCCL_OLD_T[dt]
    args = "(ncclDevComm*, unsigned long, ncclWork*)" if major >= (2, 12) else "(ncclWorkElem)"
    return f"ncclKernel_{coll}_{algo}_{proto}_{op}_{t}{args}"


def nccl_allreduce(dt: str, nbytes: float, old_names: bool = False, version: str | None = None,
                   ll_max: float = 64 * 1024, ll128_max: float = 8 * 2**20) -> str:
    """The NCCL all-reduce kernel, its protocol picked by message size as NCCL's tuner does."""
    proto = nccl_protocol(nbytes, ll_max, ll128_max)
    return nccl_kernel("AllReduce", dt, proto, version or ("2.14.3" if old_names else "2.21.5"))


def triton_name(kind: str, fused: str, idx: int) -> str:
    """Inductor's kernel names: triton_{poi,per,red}_fused_<ops>_<n>."""
    return f"triton_{kind}_fused_{fused}_{idx}"


# -- the op templates ----------------------------------------------------------------------
@dataclass(frozen=True)
class Kern:
    """One kernel an op launches: its name and its share of the op's work."""

    name: str
    share: float             # fraction of the op's compute (or bytes) this kernel does
    memory_bound: bool
    block: int = 256
    regs: int = 32
    smem: int = 0


@dataclass(frozen=True)
class OpCall:
    """One eager op as the profiler records it: nested cpu_op names and the kernels inside."""

    chain: tuple[str, ...]          # outermost first; kernels launch from the innermost
    kernels: tuple[Kern, ...]
    gflop: float                    # whole-op work (batch included)
    mbytes: float                   # whole-op memory traffic (batch included)
    cpu_us: float                   # host dispatch cost on a typical core, excluding launches
    extra_children: tuple[str, ...] = ()   # cheap cpu_ops nested without kernels (aten::empty ...)


@dataclass(frozen=True)
class Layer:
    """A model layer: a template name and its work per sample at the model's base resolution."""

    op: str                 # conv, bn, relu, silu, gelu, linear, ln, gn, attn, add, maxpool, ...
    gflop: float = 0.0      # forward GFLOP per sample
    act_mb: float = 0.0     # forward output activation, MB per sample (fp32)
    params_m: float = 0.0   # parameters, millions
    variant: int = 0        # which kernel tile variant cuDNN/cuBLAS would pick
    shape: int = 0          # conv: kernel size; linear: rows (tokens) per sample; 0 = unknown
    cin: int = 0            # conv: input channels (the 3-channel stem gets its own kernels)


@dataclass(frozen=True)
class Ctx:
    """What decides op and kernel names and sizes: dtype, layout, platform, batch scale."""

    dt: str                  # compute dtype: fp32, fp16, bf16 (AMP)
    channels_last: bool
    platform: Platform
    scale: float             # batch * (resolution / base)^2
    train: bool = True       # training mode (BatchNorm counts batches, dropout is on)
    tf32_matmul: bool = False  # torch.backends.cuda.matmul.allow_tf32 (off by default)
    algo: int = 0            # per-run salt of cuDNN/cuBLAS kernel choices (versions, benchmark)


def _chain_conv() -> tuple[str, ...]:
    return ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution")


def _conv_kerns(kind: str, layer: Layer, c: Ctx) -> list[Kern]:
    """`conv_kernels` as `Kern`s: compute-bound main kernels, memory-bound helpers."""
    regs = 168 if kind == "wgrad" else 128
    return [Kern(n, share, mem, 128 if not mem else 256, regs if not mem else 32,
                 (65536 if kind == "wgrad" else 49152) if not mem else 0)
            for n, share, mem in conv_kernels(kind, c.dt, c.platform, layer, c.channels_last, c.algo)]


def _linear_kerns(layer: Layer, c: Ctx, layout: str, salt: int) -> list[Kern]:
    """cuBLAS kernels of one matmul: a GEMV for a handful of rows, split-K reductions for long K."""
    pick = layer.variant * 5 + int(layer.gflop * 1e4) + c.algo + salt
    rows = max(1, layer.shape) * c.scale
    if c.dt == "fp32" and rows <= 8 and c.platform.sm_tag != "sm90":
        return [Kern(GEMV, 1.0, False, 128, 64)]
    ks = [Kern(gemm(c.dt, c.platform, pick, layout, c.tf32_matmul), 1.0, False, 256, 232, 65536)]
    if c.dt == "fp32" and not c.tf32_matmul and pick % 4 == 0 and c.platform.sm_tag != "sm90":
        ks = [Kern(ks[0].name, 0.96, False, 256, 126, 16384), Kern(SPLITK_REDUCE, 0.04, True, 128, 32)]
    return ks


def forward_ops(layer: Layer, c: Ctx) -> list[OpCall]:
    """The eager forward op(s) of one layer."""
    dt, s, p = c.dt, c.scale, c.platform
    g, mb = layer.gflop * s, layer.act_mb * s * (0.5 if dt != "fp32" else 1.0)
    v = layer.variant
    cast = ()
    if dt != "fp32" and layer.params_m > 0:
        # autocast casts fp32 weights on every call: aten::to -> _to_copy -> copy_ (a cast kernel)
        cast = (OpCall(("aten::to", "aten::_to_copy", "aten::copy_"),
                       (Kern(elementwise("copy", dt), 1.0, True),),
                       0.0, layer.params_m * 6, 14.0, ("aten::empty_strided",)),)
    op = layer.op
    if op == "conv":
        ks = _conv_kerns("fprop", layer, c)
        if not c.channels_last:
            ks.insert(0, Kern(cudnn_transpose(True, dt), 0.08, True))
            ks.append(Kern(cudnn_transpose(False, dt), 0.05, True))
        return [*cast, OpCall(_chain_conv(), tuple(ks), g, mb * 3, 48.0, ("aten::empty",))]
    if op == "dwconv":
        c_ = _CT[dt]
        k = (f"void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, {c_}, int>("
             f"at::GenericPackedTensorAccessor<{c_} const, 4ul, at::DefaultPtrTraits, int>, "
             f"at::GenericPackedTensorAccessor<{c_}, 4ul, at::DefaultPtrTraits, int>, "
             f"at::GenericPackedTensorAccessor<{c_} const, 4ul, at::DefaultPtrTraits, int>, "
             f"at::GenericPackedTensorAccessor<{c_} const, 1ul, at::DefaultPtrTraits, int>, bool, int, "
             f"int, int, int, int, int, int, int, int, int, int, int)")
        return [*cast, OpCall(("aten::conv2d", "aten::convolution", "aten::_convolution",
                               "aten::_conv_depthwise2d"), (Kern(k, 1.0, True, 512, 40),), 0.0,
                              mb * 2.5, 40.0)]
    if op == "deconv":
        ks = tuple(_conv_kerns("dgrad", layer, c))
        return [*cast, OpCall(("aten::conv_transpose2d", "aten::convolution", "aten::_convolution",
                               "aten::cudnn_convolution_transpose"), ks, g, mb * 3, 52.0,
                              ("aten::empty",))]
    if op == "bn":
        bn = OpCall(("aten::batch_norm", "aten::_batch_norm_impl_index", "aten::cudnn_batch_norm"),
                    (Kern(batchnorm(True, dt, c.channels_last, v), 1.0, True, 512, 40),),
                    0.0, mb * 3, 34.0, ("aten::empty_like", "aten::empty"))
        if not c.train:
            return [bn]
        # training BatchNorm counts batches: num_batches_tracked += 1, a long add per layer
        return [OpCall(("aten::add_",), (Kern(elementwise("add_long", dt), 1.0, True, 128, 16),),
                       0.0, 0.0001, 10.0), bn]
    if op in ("relu", "silu", "gelu", "sigmoid"):
        chain = {"relu": ("aten::relu_", "aten::clamp_min_"), "silu": ("aten::silu_",),
                 "gelu": ("aten::gelu",), "sigmoid": ("aten::sigmoid",)}[op]
        return [OpCall(chain, (Kern(elementwise(op, dt), 1.0, True, 128, 16),), 0.0, mb * 2, 14.0)]
    if op == "add":
        return [OpCall(("aten::add",), (Kern(elementwise("add", dt), 1.0, True, 128, 16),),
                       0.0, mb * 3, 12.0)]
    if op == "mul":
        return [OpCall(("aten::mul",), (Kern(elementwise("mul", dt), 1.0, True, 128, 16),),
                       0.0, mb * 3, 12.0)]
    if op == "linear":
        return [*cast, OpCall(("aten::linear", "aten::addmm"), tuple(_linear_kerns(layer, c, "tn", 0)),
                              g, mb * 2, 26.0, ("aten::t", "aten::transpose", "aten::as_strided"))]
    if op == "ln":
        return [OpCall(("aten::layer_norm", "aten::native_layer_norm"),
                       (Kern(layernorm("fwd", dt), 1.0, True, 128, 40),), 0.0, mb * 2, 22.0,
                       ("aten::empty",))]
    if op == "gn":
        return [OpCall(("aten::group_norm", "aten::native_group_norm"),
                       (Kern(groupnorm(True, dt), 0.5, True, 512, 32),
                        Kern(elementwise("mul", dt), 0.5, True, 128, 16)), 0.0, mb * 3, 30.0,
                       ("aten::empty",))]
    if op == "attn":
        if dt == "fp32":
            k = (Kern(mem_efficient(True), 1.0, False, 128, 128, 49152),)
            chain = ("aten::scaled_dot_product_attention",
                     "aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_forward")
        else:
            k = (Kern(flash("fwd", dt), 1.0, False, 128, 255, 49152),)
            chain = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                     "aten::_flash_attention_forward")
        return [OpCall(chain, k, g, mb * 4, 40.0, ("aten::empty", "aten::transpose"))]
    if op == "maxpool":
        return [OpCall(("aten::max_pool2d", "aten::max_pool2d_with_indices"),
                       (Kern(pooling("max_fwd", dt), 1.0, True),), 0.0, mb * 5, 18.0)]
    if op == "avgpool":
        return [OpCall(("aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d"),
                       (Kern(pooling("avg_fwd", dt), 1.0, True),), 0.0, mb * 20, 16.0)]
    if op == "upsample":
        return [OpCall(("aten::upsample_bilinear2d",),
                       (Kern(pooling("up_fwd", dt), 1.0, True),), 0.0, mb * 1.3, 20.0)]
    if op == "cat":
        return [OpCall(("aten::cat",), (Kern(elementwise("cat", dt), 1.0, True),), 0.0, mb * 2,
                       16.0)]
    if op == "softmax":
        return [OpCall(("aten::softmax", "aten::_softmax"), (Kern(softmax(True, dt), 1.0, True),),
                       0.0, mb * 2, 14.0)]
    if op == "index":
        return [OpCall(("aten::index",), (Kern(elementwise("index", dt), 1.0, True),), 0.0, mb * 2,
                       30.0, ("aten::empty",))]
    raise KeyError(op)


#: Autograd node names (the backward op of each forward template).
_BACKWARD_NODE = {
    "conv": "ConvolutionBackward0", "deconv": "ConvolutionBackward0", "dwconv": "ConvolutionBackward0",
    "bn": "CudnnBatchNormBackward0", "relu": "ReluBackward0", "silu": "SiluBackward0",
    "gelu": "GeluBackward0", "sigmoid": "SigmoidBackward0", "add": "AddBackward0",
    "mul": "MulBackward0", "linear": "AddmmBackward0", "ln": "NativeLayerNormBackward0",
    "gn": "NativeGroupNormBackward0", "maxpool": "MaxPool2DWithIndicesBackward0",
    "avgpool": "MeanBackward1", "upsample": "UpsampleBilinear2DBackward0", "cat": "CatBackward0",
    "softmax": "SoftmaxBackward0", "index": "IndexBackward0",
}


def backward_node(layer: Layer, c: Ctx) -> str:
    """The autograd node name of a layer's backward."""
    if layer.op == "attn":
        return ("ScaledDotProductEfficientAttentionBackward0" if c.dt == "fp32"
                else "ScaledDotProductFlashAttentionBackward0")
    return _BACKWARD_NODE[layer.op]


def backward_ops(layer: Layer, c: Ctx) -> list[OpCall]:
    """The aten ops one layer's autograd node runs (inside `evaluate_function: <Node>`)."""
    dt, s, p = c.dt, c.scale, c.platform
    g, mb = layer.gflop * s, layer.act_mb * s * (0.5 if dt != "fp32" else 1.0)
    v, op = layer.variant, layer.op
    if op == "dwconv":
        c_ = _CT[dt]
        acc = f"at::GenericPackedTensorAccessor<{c_} const, 4ul, at::DefaultPtrTraits, int>"
        return [OpCall(("aten::convolution_backward",),
                       (Kern(f"void at::native::(anonymous namespace)::conv_depthwise2d_backward_kernel"
                             f"<3, 1, {c_}, int>({acc}, at::GenericPackedTensorAccessor<{c_}, 4ul, "
                             f"at::DefaultPtrTraits, int>, {acc}, int, int, int, int, int, int, int, "
                             f"int, int, int, int, int, int)", 0.5, True, 512, 40),
                        Kern(f"void at::native::(anonymous namespace)::conv_depthwise2d_grad_weight_kernel"
                             f"<{c_}, float, int>({acc}, {acc}, at::GenericPackedTensorAccessor<{c_}, 4ul, "
                             f"at::DefaultPtrTraits, int>, int, int, int, int, int, int, int, int, int, "
                             f"int, int, int, int)", 0.5, True, 256, 48)),
                       0.0, mb * 5, 50.0, ("aten::empty",))]
    if op in ("conv", "deconv"):
        ks = [Kern(k.name, k.share * 0.5, k.memory_bound, k.block, k.regs, k.smem)
              for k in _conv_kerns("dgrad", layer, c) + _conv_kerns("wgrad", layer, c)]
        if not c.channels_last:
            ks.insert(0, Kern(cudnn_transpose(True, dt), 0.06, True))
            ks.append(Kern(cudnn_transpose(False, dt), 0.04, True))
        return [OpCall(("aten::convolution_backward",), tuple(ks), 2 * g, mb * 5, 60.0,
                       ("aten::empty", "aten::empty"))]
    if op == "bn":
        return [OpCall(("aten::cudnn_batch_norm_backward",),
                       (Kern(batchnorm(False, dt, c.channels_last, v), 1.0, True, 512, 48),),
                       0.0, mb * 4, 30.0, ("aten::empty_like",))]
    if op in ("relu", "silu", "gelu", "sigmoid"):
        chain = {"relu": ("aten::threshold_backward",), "silu": ("aten::silu_backward",),
                 "gelu": ("aten::gelu_backward",), "sigmoid": ("aten::sigmoid_backward",)}[op]
        kind = {"relu": "relu_bw", "silu": "silu_bw", "gelu": "gelu_bw", "sigmoid": "mul"}[op]
        return [OpCall(chain, (Kern(elementwise(kind, dt), 1.0, True, 128, 20),), 0.0, mb * 3, 14.0)]
    if op in ("add", "cat"):
        return []  # AddBackward0 passes gradients through: no kernel
    if op == "mul":
        return [OpCall(("aten::mul",), (Kern(elementwise("mul", dt), 1.0, True),), 0.0, mb * 3, 12.0),
                OpCall(("aten::mul",), (Kern(elementwise("mul", dt), 1.0, True),), 0.0, mb * 3, 12.0)]
    if op == "linear":
        return [OpCall(("aten::mm",), tuple(_linear_kerns(layer, c, "nn", 1)), g, mb * 2, 20.0),
                OpCall(("aten::mm",), tuple(_linear_kerns(layer, c, "nt", 2)), g, mb * 2, 20.0),
                OpCall(("aten::sum",), (Kern(elementwise("sum", dt), 1.0, True),), 0.0, mb, 16.0)]
    if op == "ln":
        return [OpCall(("aten::native_layer_norm_backward",),
                       (Kern(layernorm("bwd_input", dt), 0.6, True, 128, 40),
                        Kern(layernorm("bwd_gamma", dt), 0.4, True, 256, 64)), 0.0, mb * 4, 28.0,
                       ("aten::empty_like",))]
    if op == "gn":
        return [OpCall(("aten::native_group_norm_backward",),
                       (Kern(groupnorm(False, dt), 0.5, True, 512, 32),
                        Kern(elementwise("mul", dt), 0.5, True)), 0.0, mb * 4, 30.0)]
    if op == "attn":
        if dt == "fp32":
            return [OpCall(("aten::_scaled_dot_product_efficient_attention_backward",
                            "aten::_efficient_attention_backward"),
                           (Kern(mem_efficient(False), 1.0, False, 128, 128, 49152),),
                           2.5 * g, mb * 6, 50.0, ("aten::empty", "aten::empty"))]
        return [OpCall(("aten::_scaled_dot_product_flash_attention_backward",
                        "aten::_flash_attention_backward"),
                       (Kern(flash("bwd_dot", dt), 0.05, True),
                        Kern(flash("bwd_main", dt), 0.9, False, 256, 255, 98304),
                        Kern(flash("bwd_convert", dt), 0.05, True)), 2.5 * g, mb * 6, 50.0,
                       ("aten::empty", "aten::zeros"))]
    if op == "maxpool":
        return [OpCall(("aten::max_pool2d_with_indices_backward",),
                       (Kern(elementwise("fill", dt), 0.3, True), Kern(pooling("max_bwd", dt), 0.7, True)),
                       0.0, mb * 6, 20.0)]
    if op == "avgpool":
        return [OpCall(("aten::_adaptive_avg_pool2d_backward",),
                       (Kern(pooling("avg_bwd", dt), 1.0, True),), 0.0, mb * 20, 16.0)]
    if op == "upsample":
        return [OpCall(("aten::upsample_bilinear2d_backward",),
                       (Kern(elementwise("fill", dt), 0.3, True), Kern(pooling("up_bwd", dt), 0.7, True)),
                       0.0, mb * 2, 20.0)]
    if op == "softmax":
        return [OpCall(("aten::_softmax_backward_data",), (Kern(softmax(False, dt), 1.0, True),),
                       0.0, mb * 3, 14.0)]
    if op == "index":
        return [OpCall(("aten::index_put_", "aten::_index_put_impl_"),
                       (Kern(elementwise("fill", dt), 0.3, True), Kern(elementwise("index", dt), 0.7, True)),
                       0.0, mb * 3, 30.0)]
    raise KeyError(op)


def kernel_duration_us(k: Kern, call: OpCall, c: Ctx, eff: float) -> float:
    """GPU time of one kernel: roofline of its share of the op's work, plus a fixed tail."""
    p = c.platform
    if k.memory_bound or call.gflop <= 0:
        t = call.mbytes * k.share / (p.hbm_gbs * 1e-3 * eff)      # MB / (GB/s) -> us
    else:
        tf = p.tflops_fp32 if c.dt == "fp32" else p.tflops_fp16
        t = call.gflop * k.share / (tf * 1e-3 * eff)               # GFLOP / TFLOP/s -> us
    return 2.0 + t
