; ppcc's math functions for CUDA kernels, linked into every kernel module before PTX is
; generated (`nvvm-attach-target{l=...}`).
;
; MLIR's NVVM lowering turns `math.*` ops (and their LLVM intrinsics) into calls of
; libdevice's `__nv_*` functions. libdevice ships with the CUDA toolkit, which ppcc does not
; need to compile (`--target cuda` writes PTX anywhere), so ppcc defines the functions it
; emits itself, on PTX instructions:
;   exact:   sqrt, rsqrt (1/sqrt), fabs, floor, ceil, trunc, rint, round, fma, copysign,
;            fmin, fmax (f32 and f64);
;   approx:  f32 exp2/log2 (`ex2.approx`, `lg2.approx`, about 2 ulp), and from them exp,
;            log, pow and tanh as CUDA's fast-math intrinsics compute them (`__expf`,
;            `__logf`, `__powf`); f32 sin and cos through the f64 ones. f32 `exp`, `erf` and
;            `tanh` are normally inlined by ppcc's lowering as accurate polynomials
;            (`lower/mathfn.rs`) and never reach these.
;   f64:     exp, log, tanh, pow, erf, sin and cos (range reduction, series, a
;            continued fraction; error below 3e-14 relative, 2e-16 absolute for sin/cos,
;            against libm): softmax and cross-entropy accumulate in f64, and the
;            half types compute these functions in f64.
; Other f64 transcendental functions are not provided: a kernel that needs one is refused
; when its PTX still declares the function (`codegen/src/gpu.rs`).

target datalayout = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

define float @__nv_sqrtf(float %x) alwaysinline {
  %r = call float @llvm.sqrt.f32(float %x)
  ret float %r
}
define double @__nv_sqrt(double %x) alwaysinline {
  %r = call double @llvm.sqrt.f64(double %x)
  ret double %r
}
define float @__nv_rsqrtf(float %x) alwaysinline {
  %s = call float @llvm.sqrt.f32(float %x)
  %r = fdiv float 1.0, %s
  ret float %r
}
define double @__nv_rsqrt(double %x) alwaysinline {
  %s = call double @llvm.sqrt.f64(double %x)
  %r = fdiv double 1.0, %s
  ret double %r
}
define float @__nv_fabsf(float %x) alwaysinline {
  %r = call float @llvm.fabs.f32(float %x)
  ret float %r
}
define double @__nv_fabs(double %x) alwaysinline {
  %r = call double @llvm.fabs.f64(double %x)
  ret double %r
}
define float @__nv_floorf(float %x) alwaysinline {
  %r = call float @llvm.floor.f32(float %x)
  ret float %r
}
define double @__nv_floor(double %x) alwaysinline {
  %r = call double @llvm.floor.f64(double %x)
  ret double %r
}
define float @__nv_ceilf(float %x) alwaysinline {
  %r = call float @llvm.ceil.f32(float %x)
  ret float %r
}
define double @__nv_ceil(double %x) alwaysinline {
  %r = call double @llvm.ceil.f64(double %x)
  ret double %r
}
define float @__nv_truncf(float %x) alwaysinline {
  %r = call float @llvm.trunc.f32(float %x)
  ret float %r
}
define double @__nv_trunc(double %x) alwaysinline {
  %r = call double @llvm.trunc.f64(double %x)
  ret double %r
}
define float @__nv_rintf(float %x) alwaysinline {
  %r = call float @llvm.roundeven.f32(float %x)
  ret float %r
}
define double @__nv_rint(double %x) alwaysinline {
  %r = call double @llvm.roundeven.f64(double %x)
  ret double %r
}
; Half away from zero: trunc(x + copysign(0.5 - ulp/2, x)) would be exact; this form is
; exact for every f32 whose fraction is not within an ulp below one half.
define float @__nv_roundf(float %x) alwaysinline {
  %a = call float @llvm.fabs.f32(float %x)
  %h = fadd float %a, 0.5
  %f = call float @llvm.floor.f32(float %h)
  %r = call float @llvm.copysign.f32(float %f, float %x)
  ret float %r
}
define double @__nv_round(double %x) alwaysinline {
  %a = call double @llvm.fabs.f64(double %x)
  %h = fadd double %a, 0.5
  %f = call double @llvm.floor.f64(double %h)
  %r = call double @llvm.copysign.f64(double %f, double %x)
  ret double %r
}
define float @__nv_fmaf(float %x, float %y, float %z) alwaysinline {
  %r = call float @llvm.fma.f32(float %x, float %y, float %z)
  ret float %r
}
define double @__nv_fma(double %x, double %y, double %z) alwaysinline {
  %r = call double @llvm.fma.f64(double %x, double %y, double %z)
  ret double %r
}
define float @__nv_copysignf(float %x, float %y) alwaysinline {
  %r = call float @llvm.copysign.f32(float %x, float %y)
  ret float %r
}
define double @__nv_copysign(double %x, double %y) alwaysinline {
  %r = call double @llvm.copysign.f64(double %x, double %y)
  ret double %r
}
define float @__nv_fminf(float %x, float %y) alwaysinline {
  %r = call float @llvm.minnum.f32(float %x, float %y)
  ret float %r
}
define double @__nv_fmin(double %x, double %y) alwaysinline {
  %r = call double @llvm.minnum.f64(double %x, double %y)
  ret double %r
}
define float @__nv_fmaxf(float %x, float %y) alwaysinline {
  %r = call float @llvm.maxnum.f32(float %x, float %y)
  ret float %r
}
define double @__nv_fmax(double %x, double %y) alwaysinline {
  %r = call double @llvm.maxnum.f64(double %x, double %y)
  ret double %r
}

; ---- f32 approximations on ex2/lg2 ----

define float @__nv_exp2f(float %x) alwaysinline {
  %r = call float @llvm.nvvm.ex2.approx.f(float %x)
  ret float %r
}
define float @__nv_log2f(float %x) alwaysinline {
  %r = call float @llvm.nvvm.lg2.approx.f(float %x)
  ret float %r
}
; e^x = 2^n · 2^(r·log2 e) with n = rint(x·log2 e) and r = x − n·ln 2 (two-part ln 2), so
; the argument of ex2 stays in [−½, ½] and the scaling by 2^n is exact.
define float @__nv_expf(float %x) alwaysinline {
  %t = fmul float %x, 0x3FF7154760000000
  %n = call float @llvm.roundeven.f32(float %t)
  %r1 = call float @llvm.fma.f32(float %n, float 0xBFE62E4000000000, float %x)
  %r = call float @llvm.fma.f32(float %n, float 0xBEB7F7D1C0000000, float %r1)
  %rl = fmul float %r, 0x3FF7154760000000
  %p = call float @llvm.nvvm.ex2.approx.f(float %rl)
  %s = call float @llvm.nvvm.ex2.approx.f(float %n)
  %y = fmul float %p, %s
  ret float %y
}
define float @__nv_logf(float %x) alwaysinline {
  %l = call float @llvm.nvvm.lg2.approx.f(float %x)
  %r = fmul float %l, 0x3FE62E4300000000
  ret float %r
}
define float @__nv_log10f(float %x) alwaysinline {
  %l = call float @llvm.nvvm.lg2.approx.f(float %x)
  %r = fmul float %l, 0x3FD3441360000000
  ret float %r
}
define float @__nv_powf(float %x, float %y) alwaysinline {
  %l = call float @llvm.nvvm.lg2.approx.f(float %x)
  %t = fmul float %l, %y
  %r = call float @llvm.nvvm.ex2.approx.f(float %t)
  ret float %r
}
; tanh(x) = sign(x)·(1 − 2/(e^{2|x|} + 1)), |x| clamped to 10 (tanh rounds to 1 in f32);
; NaN stays NaN (`minnum` would turn it into the clamp).
define float @__nv_tanhf(float %x) alwaysinline {
  %a = call float @llvm.fabs.f32(float %x)
  %c = call float @llvm.minnum.f32(float %a, float 10.0)
  %t = fmul float %c, 2.0
  %e = call float @__nv_expf(float %t)
  %d = fadd float %e, 1.0
  %q = fdiv float 2.0, %d
  %m = fsub float 1.0, %q
  %s = call float @llvm.copysign.f32(float %m, float %x)
  %nan = fcmp uno float %x, 0.0
  %r = select i1 %nan, float %x, float %s
  ret float %r
}

; ---- f64 exp and log (relative error below 3e-14, checked against libm) ----
; exp: n = rint(x·log2 e), r = x − n·ln 2 (two-part ln 2, |r| ≤ ln2/2), e^r by its Taylor
; series to r^13/13! (truncation below 1e-17 relative), scaled by 2^n in two halves so
; that overflow gives inf and underflow fades through the subnormals to 0.
define double @__nv_exp(double %x) alwaysinline {
  %c0 = call double @llvm.maxnum.f64(double %x, double 0xC0874C0000000000)
  %c = call double @llvm.minnum.f64(double %c0, double 0x40862F3333333333)
  %t = fmul double %c, 0x3FF71547652B82FE
  %n = call double @llvm.roundeven.f64(double %t)
  %r1 = call double @llvm.fma.f64(double %n, double 0xBFE62E42FEE00000, double %c)
  %r = call double @llvm.fma.f64(double %n, double 0xBDEA39EF00000000, double %r1)
  %p12 = call double @llvm.fma.f64(double %r, double 0x3DE6124613A86D09, double 0x3E21EED8EFF8D898)
  %p11 = call double @llvm.fma.f64(double %r, double %p12, double 0x3E5AE64567F544E4)
  %p10 = call double @llvm.fma.f64(double %r, double %p11, double 0x3E927E4FB7789F5C)
  %p9 = call double @llvm.fma.f64(double %r, double %p10, double 0x3EC71DE3A556C734)
  %p8 = call double @llvm.fma.f64(double %r, double %p9, double 0x3EFA01A01A01A01A)
  %p7 = call double @llvm.fma.f64(double %r, double %p8, double 0x3F2A01A01A01A01A)
  %p6 = call double @llvm.fma.f64(double %r, double %p7, double 0x3F56C16C16C16C17)
  %p5 = call double @llvm.fma.f64(double %r, double %p6, double 0x3F81111111111111)
  %p4 = call double @llvm.fma.f64(double %r, double %p5, double 0x3FA5555555555555)
  %p3 = call double @llvm.fma.f64(double %r, double %p4, double 0x3FC5555555555555)
  %p2 = call double @llvm.fma.f64(double %r, double %p3, double 0x3FE0000000000000)
  %p1 = call double @llvm.fma.f64(double %r, double %p2, double 0x3FF0000000000000)
  %p0 = call double @llvm.fma.f64(double %r, double %p1, double 0x3FF0000000000000)
  %ni = fptosi double %n to i64
  %n1 = sdiv i64 %ni, 2
  %n2 = sub i64 %ni, %n1
  %e1 = add i64 %n1, 1023
  %e2 = add i64 %n2, 1023
  %b1 = shl i64 %e1, 52
  %b2 = shl i64 %e2, 52
  %s1 = bitcast i64 %b1 to double
  %s2 = bitcast i64 %b2 to double
  %y1 = fmul double %p0, %s1
  %y = fmul double %y1, %s2
  %nan = fcmp uno double %x, %x
  %res = select i1 %nan, double %x, double %y
  ret double %res
}
; log: x = m·2^e with m in [√½, √2) (subnormals scaled by 2^54 first), log m = 2·atanh(s),
; s = (m − 1)/(m + 1), |s| ≤ 0.172, by its series to s^21; log x = e·ln 2 + log m.
; 0 gives −inf, negatives and NaN give NaN, +inf gives +inf.
define double @__nv_log(double %x) alwaysinline {
  %small = fcmp olt double %x, 0x0010000000000000
  %xs = fmul double %x, 0x4350000000000000
  %xx = select i1 %small, double %xs, double %x
  %adj = select i1 %small, i64 54, i64 0
  %bits = bitcast double %xx to i64
  %ebits = lshr i64 %bits, 52
  %eraw = and i64 %ebits, 2047
  %e0 = sub i64 %eraw, 1023
  %mbits0 = and i64 %bits, 4503599627370495
  %mbits = or i64 %mbits0, 4607182418800017408
  %m0 = bitcast i64 %mbits to double
  %big = fcmp ogt double %m0, 0x3FF6A09E667F3BCD
  %mh = fmul double %m0, 0.5
  %m = select i1 %big, double %mh, double %m0
  %e1 = add i64 %e0, 1
  %e2 = select i1 %big, i64 %e1, i64 %e0
  %e = sub i64 %e2, %adj
  %num = fsub double %m, 1.0
  %den = fadd double %m, 1.0
  %s = fdiv double %num, %den
  %z = fmul double %s, %s
  %q21 = fadd double 0.0, 0x3FA8618618618618
  %q19 = call double @llvm.fma.f64(double %z, double %q21, double 0x3FAAF286BCA1AF28)
  %q17 = call double @llvm.fma.f64(double %z, double %q19, double 0x3FAE1E1E1E1E1E1E)
  %q15 = call double @llvm.fma.f64(double %z, double %q17, double 0x3FB1111111111111)
  %q13 = call double @llvm.fma.f64(double %z, double %q15, double 0x3FB3B13B13B13B14)
  %q11 = call double @llvm.fma.f64(double %z, double %q13, double 0x3FB745D1745D1746)
  %q9 = call double @llvm.fma.f64(double %z, double %q11, double 0x3FBC71C71C71C71C)
  %q7 = call double @llvm.fma.f64(double %z, double %q9, double 0x3FC2492492492492)
  %q5 = call double @llvm.fma.f64(double %z, double %q7, double 0x3FC999999999999A)
  %q3 = call double @llvm.fma.f64(double %z, double %q5, double 0x3FD5555555555555)
  %q1 = call double @llvm.fma.f64(double %z, double %q3, double 0x3FF0000000000000)
  %ls = fmul double %s, %q1
  %lm = fmul double %ls, 2.0
  %ef = sitofp i64 %e to double
  %hi = call double @llvm.fma.f64(double %ef, double 0x3FE62E42FEE00000, double %lm)
  %y = call double @llvm.fma.f64(double %ef, double 0x3DEA39EF00000000, double %hi)
  %zero = fcmp oeq double %x, 0.0
  %neg = fcmp olt double %x, 0.0
  %inf = fcmp oeq double %x, 0x7FF0000000000000
  %r1 = select i1 %zero, double 0xFFF0000000000000, double %y
  %r2 = select i1 %neg, double 0x7FF8000000000000, double %r1
  %r3 = select i1 %inf, double %x, double %r2
  %nan = fcmp uno double %x, %x
  %res = select i1 %nan, double %x, double %r3
  ret double %res
}

; tanh: |x| < ln2/4: expm1(2|x|) by its series (no cancellation), tanh = m/(m + 2);
; else 1 − 2/(e^{2|x|} + 1) with |x| clamped to 20 (tanh is 1 in f64 from 19.1). Odd.
define double @__nv_tanh(double %x) alwaysinline {
  %a = call double @llvm.fabs.f64(double %x)
  %small = fcmp olt double %a, 0x3FC62E42FEFA39EF
  %t = fmul double %a, 2.0
  %q14 = fadd double 0.0, 0x3DA93974A8C07C9D
  %q13 = call double @llvm.fma.f64(double %t, double %q14, double 0x3DE6124613A86D09)
  %q12 = call double @llvm.fma.f64(double %t, double %q13, double 0x3E21EED8EFF8D898)
  %q11 = call double @llvm.fma.f64(double %t, double %q12, double 0x3E5AE64567F544E4)
  %q10 = call double @llvm.fma.f64(double %t, double %q11, double 0x3E927E4FB7789F5C)
  %q9 = call double @llvm.fma.f64(double %t, double %q10, double 0x3EC71DE3A556C734)
  %q8 = call double @llvm.fma.f64(double %t, double %q9, double 0x3EFA01A01A01A01A)
  %q7 = call double @llvm.fma.f64(double %t, double %q8, double 0x3F2A01A01A01A01A)
  %q6 = call double @llvm.fma.f64(double %t, double %q7, double 0x3F56C16C16C16C17)
  %q5 = call double @llvm.fma.f64(double %t, double %q6, double 0x3F81111111111111)
  %q4 = call double @llvm.fma.f64(double %t, double %q5, double 0x3FA5555555555555)
  %q3 = call double @llvm.fma.f64(double %t, double %q4, double 0x3FC5555555555555)
  %q2 = call double @llvm.fma.f64(double %t, double %q3, double 0x3FE0000000000000)
  %q1 = call double @llvm.fma.f64(double %t, double %q2, double 0x3FF0000000000000)
  %m = fmul double %t, %q1
  %m2 = fadd double %m, 2.0
  %ts = fdiv double %m, %m2
  %ac = call double @llvm.minnum.f64(double %a, double 20.0)
  %t2 = fmul double %ac, 2.0
  %e = call double @__nv_exp(double %t2)
  %d = fadd double %e, 1.0
  %q = fdiv double 2.0, %d
  %tl = fsub double 1.0, %q
  %r = select i1 %small, double %ts, double %tl
  %s = call double @llvm.copysign.f64(double %r, double %x)
  %nan = fcmp uno double %x, %x
  %res = select i1 %nan, double %x, double %s
  ret double %res
}
; pow as numpy computes it: x^0 = 1, 1^y = 1, NaN otherwise propagates; x > 0:
; e^{y·log x}; x < 0: the same of |x| with the sign of an odd integer y, NaN for a
; non-integer y; x = ±0: 0 for y > 0, inf for y < 0 (signed for odd integer y).
define double @__nv_pow(double %x, double %y) alwaysinline {
  %ax = call double @llvm.fabs.f64(double %x)
  %l = call double @__nv_log(double %ax)
  %yl = fmul double %y, %l
  %mag = call double @__nv_exp(double %yl)
  %fy = call double @llvm.floor.f64(double %y)
  %isint = fcmp oeq double %fy, %y
  %h = fmul double %y, 0.5
  %fh = call double @llvm.floor.f64(double %h)
  %isodd0 = fcmp one double %fh, %h
  %isodd = and i1 %isint, %isodd0
  %neg = fcmp olt double %x, 0.0
  %negmag = fneg double %mag
  %signed = select i1 %isodd, double %negmag, double %mag
  %negres = select i1 %isint, double %signed, double 0x7FF8000000000000
  %r1 = select i1 %neg, double %negres, double %mag
  %xzero = fcmp oeq double %x, 0.0
  %ypos = fcmp ogt double %y, 0.0
  %zmag = select i1 %ypos, double 0.0, double 0x7FF0000000000000
  %zs = call double @llvm.copysign.f64(double %zmag, double %x)
  %zres = select i1 %isodd, double %zs, double %zmag
  %r2 = select i1 %xzero, double %zres, double %r1
  %yzero = fcmp oeq double %y, 0.0
  %xone = fcmp oeq double %x, 1.0
  %one = or i1 %yzero, %xone
  %r3 = select i1 %one, double 1.0, double %r2
  ret double %r3
}

; erf: |x| ≤ 2.5: (2/√π)·x·Σ (−1)ⁿ x²ⁿ/(n!(2n+1)) to n = 44; beyond, 1 − erfc(|x|) with
; erfc(x) = e^{−x²}/(√π·t), t = x + ½/(x + 1/(x + (3/2)/(x + ...))) to 50 levels; ±1
; from |x| = 6 on. Odd; NaN propagates.
define double @__nv_erf(double %x) alwaysinline {
  %a0 = call double @llvm.fabs.f64(double %x)
  %a = call double @llvm.minnum.f64(double %a0, double 6.0)
  %z = fmul double %a, %a
  %s44 = fadd double 0.0, 0x343A8830736A5123
  %s43 = call double @llvm.fma.f64(double %z, double %s44, double 0xB492A8FA59FFEC31)
  %s42 = call double @llvm.fma.f64(double %z, double %s43, double 0x34E9AA19D4D16643)
  %s41 = call double @llvm.fma.f64(double %z, double %s42, double 0xB5413F85FC9E143E)
  %s40 = call double @llvm.fma.f64(double %z, double %s41, double 0x3596A513F56F8A2F)
  %s39 = call double @llvm.fma.f64(double %z, double %s40, double 0xB5ED05CC9E3507C9)
  %s38 = call double @llvm.fma.f64(double %z, double %s39, double 0x36422521D98F98A9)
  %s37 = call double @llvm.fma.f64(double %z, double %s38, double 0xB6961F30BC3ACD1A)
  %s36 = call double @llvm.fma.f64(double %z, double %s37, double 0x36EA47767F2A3C32)
  %s35 = call double @llvm.fma.f64(double %z, double %s36, double 0xB73E6597092CCBF0)
  %s34 = call double @llvm.fma.f64(double %z, double %s35, double 0x37911AE81077A49E)
  %s33 = call double @llvm.fma.f64(double %z, double %s34, double 0xB7E2B778ACC3DEDF)
  %s32 = call double @llvm.fma.f64(double %z, double %s33, double 0x3833E53DEFC4E233)
  %s31 = call double @llvm.fma.f64(double %z, double %s32, double 0xB88486EEA20C2656)
  %s30 = call double @llvm.fma.f64(double %z, double %s31, double 0x38D4899FCDEF0A8D)
  %s29 = call double @llvm.fma.f64(double %z, double %s30, double 0xB923E81BB5701AC5)
  %s28 = call double @llvm.fma.f64(double %z, double %s29, double 0x3972AC65385F79AC)
  %s27 = call double @llvm.fma.f64(double %z, double %s28, double 0xB9C0EEF30FA10D2C)
  %s26 = call double @llvm.fma.f64(double %z, double %s27, double 0x3A0DA7460554E5DB)
  %s25 = call double @llvm.fma.f64(double %z, double %s26, double 0xBA5909C9DE3A31C5)
  %s24 = call double @llvm.fma.f64(double %z, double %s25, double 0x3AA45C0A838EFE59)
  %s23 = call double @llvm.fma.f64(double %z, double %s24, double 0xBAEFD6BEBD65107A)
  %s22 = call double @llvm.fma.f64(double %z, double %s23, double 0x3B37E6B81382CD42)
  %s21 = call double @llvm.fma.f64(double %z, double %s22, double 0xBB813246ABCE1BDD)
  %s20 = call double @llvm.fma.f64(double %z, double %s21, double 0x3BC7ABD72258FB6E)
  %s19 = call double @llvm.fma.f64(double %z, double %s20, double 0xBC0F1B4073B34A68)
  %s18 = call double @llvm.fma.f64(double %z, double %s19, double 0x3C5377C2110F2083)
  %s17 = call double @llvm.fma.f64(double %z, double %s18, double 0xBC97271CBE5863EC)
  %s16 = call double @llvm.fma.f64(double %z, double %s17, double 0x3CDA173A167FBA4D)
  %s15 = call double @llvm.fma.f64(double %z, double %s16, double 0xBD1BC6250FB14231)
  %s14 = call double @llvm.fma.f64(double %z, double %s15, double 0x3D5BD577E658D020)
  %s13 = call double @llvm.fma.f64(double %z, double %s14, double 0xBD9A289EE7E40F74)
  %s12 = call double @llvm.fma.f64(double %z, double %s13, double 0x3DD6F448E13E85E1)
  %s11 = call double @llvm.fma.f64(double %z, double %s12, double 0xBE12B67310AA9F3A)
  %s10 = call double @llvm.fma.f64(double %z, double %s11, double 0x3E4C2E3054870B38)
  %s9 = call double @llvm.fma.f64(double %z, double %s10, double 0xBE83777C55568CCD)
  %s8 = call double @llvm.fma.f64(double %z, double %s9, double 0x3EB87A00187A0018)
  %s7 = call double @llvm.fma.f64(double %z, double %s8, double 0xBEEBBD779334EF0B)
  %s6 = call double @llvm.fma.f64(double %z, double %s7, double 0x3F1C01C01C01C01C)
  %s5 = call double @llvm.fma.f64(double %z, double %s6, double 0xBF48D3018D3018D3)
  %s4 = call double @llvm.fma.f64(double %z, double %s5, double 0x3F72F684BDA12F68)
  %s3 = call double @llvm.fma.f64(double %z, double %s4, double 0xBF98618618618618)
  %s2 = call double @llvm.fma.f64(double %z, double %s3, double 0x3FB999999999999A)
  %s1 = call double @llvm.fma.f64(double %z, double %s2, double 0xBFD5555555555555)
  %s0 = call double @llvm.fma.f64(double %z, double %s1, double 0x3FF0000000000000)
  %sx = fmul double %s0, %a
  %small = fmul double %sx, 0x3FF20DD750429B6D
  %t50 = fadd double %a, 0.0
  %q50 = fdiv double 0x4039000000000000, %t50
  %t49 = fadd double %a, %q50
  %q49 = fdiv double 0x4038800000000000, %t49
  %t48 = fadd double %a, %q49
  %q48 = fdiv double 0x4038000000000000, %t48
  %t47 = fadd double %a, %q48
  %q47 = fdiv double 0x4037800000000000, %t47
  %t46 = fadd double %a, %q47
  %q46 = fdiv double 0x4037000000000000, %t46
  %t45 = fadd double %a, %q46
  %q45 = fdiv double 0x4036800000000000, %t45
  %t44 = fadd double %a, %q45
  %q44 = fdiv double 0x4036000000000000, %t44
  %t43 = fadd double %a, %q44
  %q43 = fdiv double 0x4035800000000000, %t43
  %t42 = fadd double %a, %q43
  %q42 = fdiv double 0x4035000000000000, %t42
  %t41 = fadd double %a, %q42
  %q41 = fdiv double 0x4034800000000000, %t41
  %t40 = fadd double %a, %q41
  %q40 = fdiv double 0x4034000000000000, %t40
  %t39 = fadd double %a, %q40
  %q39 = fdiv double 0x4033800000000000, %t39
  %t38 = fadd double %a, %q39
  %q38 = fdiv double 0x4033000000000000, %t38
  %t37 = fadd double %a, %q38
  %q37 = fdiv double 0x4032800000000000, %t37
  %t36 = fadd double %a, %q37
  %q36 = fdiv double 0x4032000000000000, %t36
  %t35 = fadd double %a, %q36
  %q35 = fdiv double 0x4031800000000000, %t35
  %t34 = fadd double %a, %q35
  %q34 = fdiv double 0x4031000000000000, %t34
  %t33 = fadd double %a, %q34
  %q33 = fdiv double 0x4030800000000000, %t33
  %t32 = fadd double %a, %q33
  %q32 = fdiv double 0x4030000000000000, %t32
  %t31 = fadd double %a, %q32
  %q31 = fdiv double 0x402F000000000000, %t31
  %t30 = fadd double %a, %q31
  %q30 = fdiv double 0x402E000000000000, %t30
  %t29 = fadd double %a, %q30
  %q29 = fdiv double 0x402D000000000000, %t29
  %t28 = fadd double %a, %q29
  %q28 = fdiv double 0x402C000000000000, %t28
  %t27 = fadd double %a, %q28
  %q27 = fdiv double 0x402B000000000000, %t27
  %t26 = fadd double %a, %q27
  %q26 = fdiv double 0x402A000000000000, %t26
  %t25 = fadd double %a, %q26
  %q25 = fdiv double 0x4029000000000000, %t25
  %t24 = fadd double %a, %q25
  %q24 = fdiv double 0x4028000000000000, %t24
  %t23 = fadd double %a, %q24
  %q23 = fdiv double 0x4027000000000000, %t23
  %t22 = fadd double %a, %q23
  %q22 = fdiv double 0x4026000000000000, %t22
  %t21 = fadd double %a, %q22
  %q21 = fdiv double 0x4025000000000000, %t21
  %t20 = fadd double %a, %q21
  %q20 = fdiv double 0x4024000000000000, %t20
  %t19 = fadd double %a, %q20
  %q19 = fdiv double 0x4023000000000000, %t19
  %t18 = fadd double %a, %q19
  %q18 = fdiv double 0x4022000000000000, %t18
  %t17 = fadd double %a, %q18
  %q17 = fdiv double 0x4021000000000000, %t17
  %t16 = fadd double %a, %q17
  %q16 = fdiv double 0x4020000000000000, %t16
  %t15 = fadd double %a, %q16
  %q15 = fdiv double 0x401E000000000000, %t15
  %t14 = fadd double %a, %q15
  %q14 = fdiv double 0x401C000000000000, %t14
  %t13 = fadd double %a, %q14
  %q13 = fdiv double 0x401A000000000000, %t13
  %t12 = fadd double %a, %q13
  %q12 = fdiv double 0x4018000000000000, %t12
  %t11 = fadd double %a, %q12
  %q11 = fdiv double 0x4016000000000000, %t11
  %t10 = fadd double %a, %q11
  %q10 = fdiv double 0x4014000000000000, %t10
  %t9 = fadd double %a, %q10
  %q9 = fdiv double 0x4012000000000000, %t9
  %t8 = fadd double %a, %q9
  %q8 = fdiv double 0x4010000000000000, %t8
  %t7 = fadd double %a, %q8
  %q7 = fdiv double 0x400C000000000000, %t7
  %t6 = fadd double %a, %q7
  %q6 = fdiv double 0x4008000000000000, %t6
  %t5 = fadd double %a, %q6
  %q5 = fdiv double 0x4004000000000000, %t5
  %t4 = fadd double %a, %q5
  %q4 = fdiv double 0x4000000000000000, %t4
  %t3 = fadd double %a, %q4
  %q3 = fdiv double 0x3FF8000000000000, %t3
  %t2 = fadd double %a, %q3
  %q2 = fdiv double 0x3FF0000000000000, %t2
  %t1 = fadd double %a, %q2
  %q1 = fdiv double 0x3FE0000000000000, %t1
  %t0 = fadd double %a, %q1
  %nz = fneg double %z
  %e = call double @__nv_exp(double %nz)
  %den = fmul double %t0, 0x3FFC5BF891B4EF6A
  %erfc = fdiv double %e, %den
  %big = fsub double 1.0, %erfc
  %issmall = fcmp olt double %a, 2.5
  %r = select i1 %issmall, double %small, double %big
  %s = call double @llvm.copysign.f64(double %r, double %x)
  %nan = fcmp uno double %x, %x
  %res = select i1 %nan, double %x, double %s
  ret double %res
}

; sin and cos: n = rint(x·2/π), r = x − n·π/2 (π/2 in three parts, each step an fma),
; |r| ≤ π/4; sin r and cos r by their Taylor series (to r¹⁹ and r¹⁸), chosen and signed
; by n mod 4. Accurate for |x| up to about 1e9; ±inf and NaN give NaN.
define internal void @ppcc_sincos(double %x, ptr %sp, ptr %cp) alwaysinline {
  %t = fmul double %x, 0x3FE45F306DC9C883
  %n = call double @llvm.roundeven.f64(double %t)
  %nn = fneg double %n
  %r1 = call double @llvm.fma.f64(double %nn, double 0x3FF921FB54400000, double %x)
  %r2 = call double @llvm.fma.f64(double %nn, double 0x3DD0B4611A600000, double %r1)
  %r = call double @llvm.fma.f64(double %nn, double 0x3BA3198A2E000000, double %r2)
  %z = fmul double %r, %r
  %ps9 = fadd double 0.0, 0xBC62F49B46814157
  %ps8 = call double @llvm.fma.f64(double %z, double %ps9, double 0x3CE952C77030AD4A)
  %ps7 = call double @llvm.fma.f64(double %z, double %ps8, double 0xBD6AE7F3E733B81F)
  %ps6 = call double @llvm.fma.f64(double %z, double %ps7, double 0x3DE6124613A86D09)
  %ps5 = call double @llvm.fma.f64(double %z, double %ps6, double 0xBE5AE64567F544E4)
  %ps4 = call double @llvm.fma.f64(double %z, double %ps5, double 0x3EC71DE3A556C734)
  %ps3 = call double @llvm.fma.f64(double %z, double %ps4, double 0xBF2A01A01A01A01A)
  %ps2 = call double @llvm.fma.f64(double %z, double %ps3, double 0x3F81111111111111)
  %ps1 = call double @llvm.fma.f64(double %z, double %ps2, double 0xBFC5555555555555)
  %ps0 = call double @llvm.fma.f64(double %z, double %ps1, double 0x3FF0000000000000)
  %sr = fmul double %r, %ps0
  %pc9 = fadd double 0.0, 0xBCA6827863B97D97
  %pc8 = call double @llvm.fma.f64(double %z, double %pc9, double 0x3D2AE7F3E733B81F)
  %pc7 = call double @llvm.fma.f64(double %z, double %pc8, double 0xBDA93974A8C07C9D)
  %pc6 = call double @llvm.fma.f64(double %z, double %pc7, double 0x3E21EED8EFF8D898)
  %pc5 = call double @llvm.fma.f64(double %z, double %pc6, double 0xBE927E4FB7789F5C)
  %pc4 = call double @llvm.fma.f64(double %z, double %pc5, double 0x3EFA01A01A01A01A)
  %pc3 = call double @llvm.fma.f64(double %z, double %pc4, double 0xBF56C16C16C16C17)
  %pc2 = call double @llvm.fma.f64(double %z, double %pc3, double 0x3FA5555555555555)
  %pc1 = call double @llvm.fma.f64(double %z, double %pc2, double 0xBFE0000000000000)
  %pc0 = call double @llvm.fma.f64(double %z, double %pc1, double 0x3FF0000000000000)
  %cr = fadd double %pc0, 0.0
  %ni = fptosi double %n to i64
  %q = and i64 %ni, 3
  %nsr = fneg double %sr
  %ncr = fneg double %cr
  %q1 = icmp eq i64 %q, 1
  %q2 = icmp eq i64 %q, 2
  %q3 = icmp eq i64 %q, 3
  %s_a = select i1 %q1, double %cr, double %sr
  %s_b = select i1 %q2, double %nsr, double %s_a
  %s = select i1 %q3, double %ncr, double %s_b
  %c_a = select i1 %q1, double %nsr, double %cr
  %c_b = select i1 %q2, double %ncr, double %c_a
  %c = select i1 %q3, double %sr, double %c_b
  %ax = call double @llvm.fabs.f64(double %x)
  %fin = fcmp olt double %ax, 0x7FF0000000000000
  %so = select i1 %fin, double %s, double 0x7FF8000000000000
  %co = select i1 %fin, double %c, double 0x7FF8000000000000
  store double %so, ptr %sp
  store double %co, ptr %cp
  ret void
}
define double @__nv_sin(double %x) alwaysinline {
  %s = alloca double
  %c = alloca double
  call void @ppcc_sincos(double %x, ptr %s, ptr %c)
  %r = load double, ptr %s
  ret double %r
}
define float @__nv_sinf(float %x) alwaysinline {
  %d = fpext float %x to double
  %r = call double @__nv_sin(double %d)
  %f = fptrunc double %r to float
  ret float %f
}
define double @__nv_cos(double %x) alwaysinline {
  %s = alloca double
  %c = alloca double
  call void @ppcc_sincos(double %x, ptr %s, ptr %c)
  %r = load double, ptr %c
  ret double %r
}
define float @__nv_cosf(float %x) alwaysinline {
  %d = fpext float %x to double
  %r = call double @__nv_cos(double %d)
  %f = fptrunc double %r to float
  ret float %f
}

define float @__nv_erff(float %x) alwaysinline {
  %d = fpext float %x to double
  %r = call double @__nv_erf(double %d)
  %f = fptrunc double %r to float
  ret float %f
}

declare float @llvm.sqrt.f32(float)
declare double @llvm.sqrt.f64(double)
declare float @llvm.fabs.f32(float)
declare double @llvm.fabs.f64(double)
declare float @llvm.floor.f32(float)
declare double @llvm.floor.f64(double)
declare float @llvm.ceil.f32(float)
declare double @llvm.ceil.f64(double)
declare float @llvm.trunc.f32(float)
declare double @llvm.trunc.f64(double)
declare float @llvm.roundeven.f32(float)
declare double @llvm.roundeven.f64(double)
declare float @llvm.fma.f32(float, float, float)
declare double @llvm.fma.f64(double, double, double)
declare float @llvm.copysign.f32(float, float)
declare double @llvm.copysign.f64(double, double)
declare float @llvm.minnum.f32(float, float)
declare double @llvm.minnum.f64(double, double)
declare float @llvm.maxnum.f32(float, float)
declare double @llvm.maxnum.f64(double, double)
declare float @llvm.nvvm.ex2.approx.f(float)
declare float @llvm.nvvm.lg2.approx.f(float)
