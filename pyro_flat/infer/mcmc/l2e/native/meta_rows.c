/* L2E's meta-network over rows, for x86-64 CPUs with AVX2 and FMA (pyro_flat.infer.mcmc.native).
 *
 * For the rows start <= i < stop of a feature-major input X (9 rows, leading dimension ld):
 *
 *     out[i] = bw + sum_j w[j] relu(b1[j] + sum_k relu(b0[k] + sum_f X[f ld + i] W0[f 32 + k])
 *                                                  W1[k 32 + j])
 *
 * Sixteen rows at a time, one row per SIMD lane, with the 32 hidden units of the first layer
 * kept in a 2 KB buffer and the second layer's units accumulated four at a time in registers:
 * the network's weights and activations never leave the first-level cache. The sums run in
 * float32 in the order written here (the result differs from a BLAS evaluation by rounding).
 * meta_rows_segments runs the blocks of all segments in an OpenMP loop; built with -fopenmp it
 * uses the OpenMP runtime already in the process (torch's libgomp), so torch.set_num_threads
 * sets its threads too. Every row is computed alone: the result does not depend on them.
 */
#include <immintrin.h>
#include <stdint.h>

int meta_rows_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static void rows_one_by_one(const float* X, int64_t ld, int64_t start, int64_t stop,
                            const float* W0, const float* b0, const float* W1,
                            const float* b1, const float* w, float bw, float* out) {
    for (int64_t i = start; i < stop; ++i) {
        float h0[32];
        for (int k = 0; k < 32; ++k) {
            float a = b0[k];
            for (int f = 0; f < 9; ++f) a += X[f * ld + i] * W0[f * 32 + k];
            h0[k] = a > 0.f ? a : 0.f;
        }
        float o = bw;
        for (int j = 0; j < 32; ++j) {
            float a = b1[j];
            for (int k = 0; k < 32; ++k) a += h0[k] * W1[k * 32 + j];
            o += (a > 0.f ? a : 0.f) * w[j];
        }
        out[i] = o;
    }
}

void meta_rows(const float* X, int64_t ld, int64_t start, int64_t stop,
               const float* W0, const float* b0, const float* W1, const float* b1,
               const float* w, float bw, float* out) {
    float h0[32 * 16] __attribute__((aligned(32)));
    const __m256 zero = _mm256_setzero_ps();
    int64_t i = start;
    for (; i + 16 <= stop; i += 16) {
        for (int k = 0; k < 32; k += 2) {  /* first layer: units k, k + 1 */
            __m256 a0 = _mm256_set1_ps(b0[k]), a1 = a0;
            __m256 c0 = _mm256_set1_ps(b0[k + 1]), c1 = c0;
            for (int f = 0; f < 9; ++f) {
                __m256 xa = _mm256_loadu_ps(X + f * ld + i);
                __m256 xb = _mm256_loadu_ps(X + f * ld + i + 8);
                __m256 wa = _mm256_set1_ps(W0[f * 32 + k]);
                __m256 wb = _mm256_set1_ps(W0[f * 32 + k + 1]);
                a0 = _mm256_fmadd_ps(xa, wa, a0);
                a1 = _mm256_fmadd_ps(xb, wa, a1);
                c0 = _mm256_fmadd_ps(xa, wb, c0);
                c1 = _mm256_fmadd_ps(xb, wb, c1);
            }
            _mm256_store_ps(h0 + k * 16, _mm256_max_ps(a0, zero));
            _mm256_store_ps(h0 + k * 16 + 8, _mm256_max_ps(a1, zero));
            _mm256_store_ps(h0 + (k + 1) * 16, _mm256_max_ps(c0, zero));
            _mm256_store_ps(h0 + (k + 1) * 16 + 8, _mm256_max_ps(c1, zero));
        }
        __m256 oa = _mm256_set1_ps(bw), ob = oa;
        for (int j = 0; j < 32; j += 4) {  /* second layer: units j .. j + 3, then the output */
            __m256 p0 = _mm256_set1_ps(b1[j]), q0 = p0;
            __m256 p1 = _mm256_set1_ps(b1[j + 1]), q1 = p1;
            __m256 p2 = _mm256_set1_ps(b1[j + 2]), q2 = p2;
            __m256 p3 = _mm256_set1_ps(b1[j + 3]), q3 = p3;
            for (int k = 0; k < 32; ++k) {
                __m256 ha = _mm256_load_ps(h0 + k * 16);
                __m256 hb = _mm256_load_ps(h0 + k * 16 + 8);
                const float* wk = W1 + k * 32 + j;
                __m256 w0 = _mm256_set1_ps(wk[0]), w1 = _mm256_set1_ps(wk[1]);
                __m256 w2 = _mm256_set1_ps(wk[2]), w3 = _mm256_set1_ps(wk[3]);
                p0 = _mm256_fmadd_ps(ha, w0, p0);
                q0 = _mm256_fmadd_ps(hb, w0, q0);
                p1 = _mm256_fmadd_ps(ha, w1, p1);
                q1 = _mm256_fmadd_ps(hb, w1, q1);
                p2 = _mm256_fmadd_ps(ha, w2, p2);
                q2 = _mm256_fmadd_ps(hb, w2, q2);
                p3 = _mm256_fmadd_ps(ha, w3, p3);
                q3 = _mm256_fmadd_ps(hb, w3, q3);
            }
            __m256 v0 = _mm256_set1_ps(w[j]), v1 = _mm256_set1_ps(w[j + 1]);
            __m256 v2 = _mm256_set1_ps(w[j + 2]), v3 = _mm256_set1_ps(w[j + 3]);
            oa = _mm256_fmadd_ps(_mm256_max_ps(p0, zero), v0, oa);
            ob = _mm256_fmadd_ps(_mm256_max_ps(q0, zero), v0, ob);
            oa = _mm256_fmadd_ps(_mm256_max_ps(p1, zero), v1, oa);
            ob = _mm256_fmadd_ps(_mm256_max_ps(q1, zero), v1, ob);
            oa = _mm256_fmadd_ps(_mm256_max_ps(p2, zero), v2, oa);
            ob = _mm256_fmadd_ps(_mm256_max_ps(q2, zero), v2, ob);
            oa = _mm256_fmadd_ps(_mm256_max_ps(p3, zero), v3, oa);
            ob = _mm256_fmadd_ps(_mm256_max_ps(q3, zero), v3, ob);
        }
        _mm256_storeu_ps(out + i, oa);
        _mm256_storeu_ps(out + i + 8, ob);
    }
    rows_one_by_one(X, ld, i, stop, W0, b0, W1, b1, w, bw, out);
}

/* Rows of several segments (segment j: rows starts[j] .. stops[j], first-layer weights
   W0s + j 9 32), in blocks of BLOCK rows spread over the OpenMP threads. */
#define BLOCK 2048
void meta_rows_segments(const float* X, int64_t ld, int64_t nseg, const int64_t* starts,
                        const int64_t* stops, const float* W0s, const float* b0,
                        const float* W1, const float* b1, const float* w, float bw,
                        float* out) {
    int64_t nblocks = 0;
    for (int64_t j = 0; j < nseg; ++j) nblocks += (stops[j] - starts[j] + BLOCK - 1) / BLOCK;
    #pragma omp parallel for schedule(static) if (nblocks > 1)
    for (int64_t b = 0; b < nblocks; ++b) {
        int64_t j = 0, k = b;  /* block b is the k-th block of segment j */
        while (k >= (stops[j] - starts[j] + BLOCK - 1) / BLOCK) {
            k -= (stops[j] - starts[j] + BLOCK - 1) / BLOCK;
            ++j;
        }
        int64_t lo = starts[j] + k * BLOCK;
        int64_t hi = lo + BLOCK < stops[j] ? lo + BLOCK : stops[j];
        meta_rows(X, ld, lo, hi, W0s + j * 9 * 32, b0, W1, b1, w, bw, out);
    }
}
