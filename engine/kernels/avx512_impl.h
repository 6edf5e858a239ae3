// Internal to engine/kernels: AVX-512 helpers shared by the units built with AVX-512 flags
// (bi_kernels_avx512.cpp, bf16_dot_avx512.cpp), included inside their anonymous namespace after
// bi_rowwise_impl.h, so each unit has its own copy compiled with its own flags.
//
// No includes here: the including unit provides <immintrin.h> and bi_kernels.h.

inline __mmask16 first_n(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

// In-place transpose of a 16 x 16 float block held as 16 row vectors.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  __m512 s[16];  // s[4b + c], 128-bit lane L: column 4L + c of rows 4b .. 4b + 3
  for (int b = 0; b < 4; ++b) {
    const __m512d t0 = _mm512_castps_pd(t[4 * b]);
    const __m512d t1 = _mm512_castps_pd(t[4 * b + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * b + 2]);
    const __m512d t3 = _mm512_castps_pd(t[4 * b + 3]);
    s[4 * b + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    s[4 * b + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    s[4 * b + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    s[4 * b + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(s[c], s[4 + c], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(s[c], s[4 + c], 0xEE);
    const __m512 x2 = _mm512_shuffle_f32x4(s[8 + c], s[12 + c], 0x44);
    const __m512 x3 = _mm512_shuffle_f32x4(s[8 + c], s[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(x0, x2, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(x0, x2, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(x1, x3, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(x1, x3, 0xDD);
  }
}

// Round to nearest even bfloat16 (as float_to_bf16), 16 lanes.
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

inline void store16(const GemmArgs& a, int64_t row, int64_t n0, __m512 v) {
  if (a.bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(a.bias + n0));
  if (a.y_bf16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(a.y) + row * a.ldy + n0),
                        to_bf16(v));
  } else {
    _mm512_storeu_ps(static_cast<float*>(a.y) + row * a.ldy + n0, v);
  }
}
