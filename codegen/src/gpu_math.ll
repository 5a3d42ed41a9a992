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
;            log, pow, tanh, sin and cos (`sin.approx`/`cos.approx`) as CUDA's fast-math
;            intrinsics compute them (`__expf`, `__logf`, `__powf`). f32 `exp`, `erf` and
;            `tanh` are normally inlined by ppcc's lowering as accurate polynomials
;            (`lower/mathfn.rs`) and never reach these.
;   f64:     exp, log, tanh and pow (range reduction and series; relative error below
;            3e-14 against libm): softmax and cross-entropy accumulate in f64, and the
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
; tanh(x) = sign(x)·(1 − 2/(e^{2|x|} + 1)), |x| clamped to 10 (tanh rounds to 1 in f32).
define float @__nv_tanhf(float %x) alwaysinline {
  %a = call float @llvm.fabs.f32(float %x)
  %c = call float @llvm.minnum.f32(float %a, float 10.0)
  %t = fmul float %c, 2.0
  %e = call float @__nv_expf(float %t)
  %d = fadd float %e, 1.0
  %q = fdiv float 2.0, %d
  %m = fsub float 1.0, %q
  %r = call float @llvm.copysign.f32(float %m, float %x)
  ret float %r
}
define float @__nv_sinf(float %x) alwaysinline {
  %r = call float @llvm.nvvm.sin.approx.f(float %x)
  ret float %r
}
define float @__nv_cosf(float %x) alwaysinline {
  %r = call float @llvm.nvvm.cos.approx.f(float %x)
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
declare float @llvm.nvvm.sin.approx.f(float)
declare float @llvm.nvvm.cos.approx.f(float)
