// Microbenchmark of the greedy pass variants on one hot row and on 64 rows streamed (docs/performance-history.md,
// "Greedy in one pass"): gcc -O2 -march=x86-64-v4 -o greedy_passes bench/micro/greedy_passes.c -lm && ./greedy_passes
// Ratios are to the bare 4-accumulator max of the same row in the same round.
// greedy microbench: variants of max/argmax passes, hot (1 row) and streamed (64 rows)
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <math.h>
#define N 163840
#define ROWS 64
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
#define NINF _mm512_set1_ps(-INFINITY)
__attribute__((noinline)) float v_floor(const float*r,int*o){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;
 for(int i=0;i<N;i+=64){a0=_mm512_max_ps(_mm512_loadu_ps(r+i),a0);a1=_mm512_max_ps(_mm512_loadu_ps(r+i+16),a1);a2=_mm512_max_ps(_mm512_loadu_ps(r+i+32),a2);a3=_mm512_max_ps(_mm512_loadu_ps(r+i+48),a3);}
 return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)));}
__attribute__((noinline)) float v_nanmax(const float*r,int*o){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;__mmask16 k=0;
 for(int i=0;i<N;i+=64){__m512 x0=_mm512_loadu_ps(r+i),x1=_mm512_loadu_ps(r+i+16),x2=_mm512_loadu_ps(r+i+32),x3=_mm512_loadu_ps(r+i+48);
 k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x2,x3,_CMP_UNORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 *o=k;return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)));}
static float bm[N/256];
__attribute__((noinline)) float v_scan(const float*r,int*o){__mmask16 k=0;
 for(int b=0;b<N/256;b++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+b*256;
 for(int i=0;i<256;i+=64){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);
 k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x2,x3,_CMP_UNORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 bm[b]=_mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)));}
 *o=k; float t=-INFINITY;for(int b=0;b<N/256;b++)t=bm[b]>t?bm[b]:t; return t;}
#define BLOCKARG(NAME, MAXOP, NANCHK, PF) \
__attribute__((noinline)) float NAME(const float*r,int*o){__mmask16 k=0;__m512 best=NINF,bi=_mm512_setzero_ps(),bc=_mm512_setzero_ps(),one=_mm512_set1_ps(1);\
 for(int b=0;b<N/256;b++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+b*256; if(PF){_mm_prefetch((const char*)(p+2048),_MM_HINT_T0);}\
 for(int i=0;i<256;i+=64){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);\
 if(NANCHK){k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x2,x3,_CMP_UNORD_Q);}\
 a0=MAXOP(x0,a0);a1=MAXOP(x1,a1);a2=MAXOP(x2,a2);a3=MAXOP(x3,a3);}\
 __m512 m=_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)); __mmask16 g=_mm512_cmp_ps_mask(m,best,_CMP_GT_OQ);\
 best=_mm512_mask_mov_ps(best,g,m); bi=_mm512_mask_mov_ps(bi,g,bc); bc=_mm512_add_ps(bc,one);}\
 *o=k; float t=_mm512_reduce_max_ps(best); __mmask16 e=_mm512_cmp_ps_mask(best,_mm512_set1_ps(t),_CMP_EQ_OQ);\
 o[1]=(int)_mm512_mask_reduce_min_ps(e,bi); return t;}
#define MAXP(x,a) _mm512_max_ps(x,a)
#define RANGEP(x,a) _mm512_range_ps(a,x,5)
BLOCKARG(v_blockarg, MAXP, 1, 0)
BLOCKARG(v_blockarg_pf, MAXP, 1, 1)
BLOCKARG(v_blockarg_nonan, MAXP, 0, 0)
// NaN check by one add per 4 vectors on the tree: s += (x0-x0)... (sum of x*0 detects NaN and inf)
__attribute__((noinline)) float v_blockarg_sum(const float*r,int*o){__m512 best=NINF,bi=_mm512_setzero_ps(),bc=_mm512_setzero_ps(),one=_mm512_set1_ps(1),s=_mm512_setzero_ps();
 for(int b=0;b<N/256;b++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+b*256;
 for(int i=0;i<256;i+=64){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);
 s=_mm512_add_ps(s,_mm512_sub_ps(_mm512_add_ps(x0,x1),_mm512_add_ps(x2,x3)));}
 __m512 m=_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)); __mmask16 g=_mm512_cmp_ps_mask(m,best,_CMP_GT_OQ);
 best=_mm512_mask_mov_ps(best,g,m); bi=_mm512_mask_mov_ps(bi,g,bc); bc=_mm512_add_ps(bc,one);}
 o[0]=_mm512_cmp_ps_mask(s,s,_CMP_UNORD_Q); float t=_mm512_reduce_max_ps(best); __mmask16 e=_mm512_cmp_ps_mask(best,_mm512_set1_ps(t),_CMP_EQ_OQ);
 o[1]=(int)_mm512_mask_reduce_min_ps(e,bi); return t;}
// 8 accumulators, block of 256, nan by unord of pairs
__attribute__((noinline)) float v_scan8(const float*r,int*o){__mmask16 k=0;
 for(int b=0;b<N/256;b++){const float*p=r+b*256;__m512 a[8];for(int j=0;j<8;j++)a[j]=NINF;
 for(int i=0;i<256;i+=128){__m512 x[8];for(int j=0;j<8;j++)x[j]=_mm512_loadu_ps(p+i+16*j);
 k|=_mm512_cmp_ps_mask(x[0],x[1],_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x[2],x[3],_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x[4],x[5],_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x[6],x[7],_CMP_UNORD_Q);
 for(int j=0;j<8;j++)a[j]=_mm512_max_ps(x[j],a[j]);}
 bm[b]=_mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a[0],a[1]),_mm512_max_ps(a[2],a[3])),_mm512_max_ps(_mm512_max_ps(a[4],a[5]),_mm512_max_ps(a[6],a[7]))));}
 *o=k; float t=-INFINITY;for(int b=0;b<N/256;b++)t=bm[b]>t?bm[b]:t; return t;}

__attribute__((noinline)) float v_scan_ord(const float*r,int*o){__mmask16 k0=0xffff,k1=0xffff;
 for(int b=0;b<N/256;b++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+b*256;
 for(int i=0;i<256;i+=64){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);
 k0=_mm512_mask_cmp_ps_mask(k0,x0,x1,_CMP_ORD_Q);k1=_mm512_mask_cmp_ps_mask(k1,x2,x3,_CMP_ORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 bm[b]=_mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)));}
 *o=(k0&k1)!=0xffff; float t=-INFINITY;for(int b=0;b<N/256;b++)t=bm[b]>t?bm[b]:t; return t;}
__attribute__((noinline)) float v_blockarg_ord(const float*r,int*o){__mmask16 k0=0xffff,k1=0xffff;__m512 best=NINF,bi=_mm512_setzero_ps(),bc=_mm512_setzero_ps(),one=_mm512_set1_ps(1);
 for(int b=0;b<N/256;b++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+b*256;
 for(int i=0;i<256;i+=64){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);
 k0=_mm512_mask_cmp_ps_mask(k0,x0,x1,_CMP_ORD_Q);k1=_mm512_mask_cmp_ps_mask(k1,x2,x3,_CMP_ORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 __m512 m=_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)); __mmask16 g=_mm512_cmp_ps_mask(m,best,_CMP_GT_OQ);
 best=_mm512_mask_mov_ps(best,g,m); bi=_mm512_mask_mov_ps(bi,g,bc); bc=_mm512_add_ps(bc,one);}
 *o=(k0&k1)!=0xffff; float t=_mm512_reduce_max_ps(best); __mmask16 e=_mm512_cmp_ps_mask(best,_mm512_set1_ps(t),_CMP_EQ_OQ);
 o[1]=(int)_mm512_mask_reduce_min_ps(e,bi); return t;}
// nan via block: max of unord-sticky... compare each block's four accumulators with a vector ord check of min(x)? no: use vector sum of (x0 ord x1) as float mask
__attribute__((noinline)) float v_blockarg_ord4(const float*r,int*o){__mmask16 k0=0xffff,k1=0xffff,k2=0xffff,k3=0xffff;__m512 best=NINF,bi=_mm512_setzero_ps(),bc=_mm512_setzero_ps(),one=_mm512_set1_ps(1);
 for(int b=0;b<N/256;b++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+b*256;
 for(int i=0;i<256;i+=128){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);
 __m512 y0=_mm512_loadu_ps(p+i+64),y1=_mm512_loadu_ps(p+i+80),y2=_mm512_loadu_ps(p+i+96),y3=_mm512_loadu_ps(p+i+112);
 k0=_mm512_mask_cmp_ps_mask(k0,x0,x1,_CMP_ORD_Q);k1=_mm512_mask_cmp_ps_mask(k1,x2,x3,_CMP_ORD_Q);
 k2=_mm512_mask_cmp_ps_mask(k2,y0,y1,_CMP_ORD_Q);k3=_mm512_mask_cmp_ps_mask(k3,y2,y3,_CMP_ORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);
 a0=_mm512_max_ps(y0,a0);a1=_mm512_max_ps(y1,a1);a2=_mm512_max_ps(y2,a2);a3=_mm512_max_ps(y3,a3);}
 __m512 m=_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)); __mmask16 g=_mm512_cmp_ps_mask(m,best,_CMP_GT_OQ);
 best=_mm512_mask_mov_ps(best,g,m); bi=_mm512_mask_mov_ps(bi,g,bc); bc=_mm512_add_ps(bc,one);}
 *o=(k0&k1&k2&k3)!=0xffff; float t=_mm512_reduce_max_ps(best); __mmask16 e=_mm512_cmp_ps_mask(best,_mm512_set1_ps(t),_CMP_EQ_OQ);
 o[1]=(int)_mm512_mask_reduce_min_ps(e,bi); return t;}
// avx2-width (ymm) blockarg with vector nan accumulate
__attribute__((noinline)) float v_blockarg_ymm(const float*r,int*o){__m256 best=_mm256_set1_ps(-INFINITY),bi=_mm256_setzero_ps(),bc=bi,one=_mm256_set1_ps(1),nan=_mm256_setzero_ps();
 for(int b=0;b<N/256;b++){__m256 a0=_mm256_set1_ps(-INFINITY),a1=a0,a2=a0,a3=a0;const float*p=r+b*256;
 for(int i=0;i<256;i+=32){__m256 x0=_mm256_loadu_ps(p+i),x1=_mm256_loadu_ps(p+i+8),x2=_mm256_loadu_ps(p+i+16),x3=_mm256_loadu_ps(p+i+24);
 nan=_mm256_or_ps(nan,_mm256_or_ps(_mm256_cmp_ps(x0,x1,_CMP_UNORD_Q),_mm256_cmp_ps(x2,x3,_CMP_UNORD_Q)));
 a0=_mm256_max_ps(x0,a0);a1=_mm256_max_ps(x1,a1);a2=_mm256_max_ps(x2,a2);a3=_mm256_max_ps(x3,a3);}
 __m256 m=_mm256_max_ps(_mm256_max_ps(a0,a1),_mm256_max_ps(a2,a3)); __m256 g=_mm256_cmp_ps(m,best,_CMP_GT_OQ);
 best=_mm256_blendv_ps(best,m,g); bi=_mm256_blendv_ps(bi,bc,g); bc=_mm256_add_ps(bc,one);}
 *o=_mm256_movemask_ps(nan)!=0; float v[8];_mm256_storeu_ps(v,best);float t=v[0];for(int j=1;j<8;j++)t=v[j]>t?v[j]:t; return t;}

static inline __m512 r2a(__m512 a,__m512 b){return _mm512_max_ps(_mm512_shuffle_f32x4(a,b,_MM_SHUFFLE(1,0,1,0)),_mm512_shuffle_f32x4(a,b,_MM_SHUFFLE(3,2,3,2)));}
static inline __m512 r2b(__m512 a,__m512 b){return _mm512_max_ps(_mm512_shuffle_f32x4(a,b,_MM_SHUFFLE(2,0,2,0)),_mm512_shuffle_f32x4(a,b,_MM_SHUFFLE(3,1,3,1)));}
static inline __m512 r2c(__m512 a,__m512 b){return _mm512_max_ps(_mm512_unpacklo_ps(a,b),_mm512_unpackhi_ps(a,b));}
static int perm16[16];
static inline __m512 reduce16(const __m512*v){__m512 t[8],u[4],w[2];
 for(int i=0;i<8;i++)t[i]=r2a(v[2*i],v[2*i+1]);
 for(int i=0;i<4;i++)u[i]=r2b(t[2*i],t[2*i+1]);
 for(int i=0;i<2;i++)w[i]=r2c(u[2*i],u[2*i+1]);
 return r2c(w[0],w[1]);}
__attribute__((noinline)) float v_scan_t16(const float*r,int*o){__mmask16 k=0; __m512i idx=_mm512_loadu_si512(perm16);
 for(int g=0;g<N/4096;g++){__m512 v[16];
 for(int bb=0;bb<16;bb++){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;const float*p=r+(g*16+bb)*256;
 for(int i=0;i<256;i+=64){__m512 x0=_mm512_loadu_ps(p+i),x1=_mm512_loadu_ps(p+i+16),x2=_mm512_loadu_ps(p+i+32),x3=_mm512_loadu_ps(p+i+48);
 k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x2,x3,_CMP_UNORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 v[bb]=_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3));}
 _mm512_storeu_ps(bm+g*16,_mm512_permutexvar_ps(idx,reduce16(v)));}
 *o=k; float t=-INFINITY;for(int b=0;b<N/256;b++)t=bm[b]>t?bm[b]:t; return t;}
typedef float(*F)(const float*,int*);
F fs[]={v_floor,v_nanmax,v_scan,v_blockarg,v_blockarg_pf,v_blockarg_nonan,v_blockarg_sum,v_scan_ord,v_blockarg_ord,v_blockarg_ord4,v_blockarg_ymm,v_scan_t16};
const char*nm[]={"floor","nanmax","scan(now)","blockarg","blockarg+pf","blockarg-nonan","blockarg-sum","scan-ord","blockarg-ord","blockarg-ord4","blockarg-ymm","scan-t16"};
#define NF 12
int cmpd(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(){ {__m512 v[16]; for(int j=0;j<16;j++)v[j]=_mm512_set1_ps((float)j); float o[16]; _mm512_storeu_ps(o,reduce16(v)); int pos[16]; for(int i=0;i<16;i++)pos[(int)o[i]]=i; for(int j=0;j<16;j++)perm16[j]=pos[j];}float*r=aligned_alloc(64,(size_t)N*ROWS*4);srand(1);for(long i=0;i<(long)N*ROWS;i++)r[i]=(rand()/(float)RAND_MAX)*6-3;
 for(int q=0;q<ROWS;q++)r[(long)q*N+12345+q*77]=9;
 int o[2];volatile float s;
 for(int round=0;round<3;round++){
  static double hot[NF][301],str[NF][41];
  for(int rep=0;rep<301;rep++)for(int f=0;f<NF;f++){double a=now();s=fs[f](r,o);hot[f][rep]=now()-a;}
  for(int rep=0;rep<41;rep++)for(int f=0;f<NF;f++){double a=now();for(int q=0;q<ROWS;q++)s=fs[f](r+(long)q*N,o);str[f][rep]=(now()-a)/ROWS;}
  for(int f=0;f<NF;f++){qsort(hot[f],301,8,cmpd);qsort(str[f],41,8,cmpd);}
  printf("round %d: hot floor %.2f us, 64-row stream floor %.2f us/row\n",round,hot[0][150]/1e3,str[0][20]/1e3);
  for(int f=1;f<NF;f++)printf("  %-16s hot %.2fx  stream %.2fx\n",nm[f],hot[f][150]/hot[0][150],str[f][20]/str[0][20]);}
 int ok=1;for(int q=0;q<ROWS;q++){v_blockarg_ord4(r+(long)q*N,o);if(o[1]!=(12345+q*77)/256||o[0])ok=0;} r[777]=NAN; v_blockarg_ord4(r,o); if(!o[0])ok=0; v_blockarg_ord(r,o); if(!o[0])ok=0;v_scan_ord(r,o); if(!o[0])ok=0; r[777]=0;for(int q=0;q<ROWS;q++){v_blockarg(r+(long)q*N,o);if(o[1]!=(12345+q*77)/256)ok=0;} {float ref[N/256]; v_scan(r,o); for(int b=0;b<N/256;b++)ref[b]=bm[b]; v_scan_t16(r,o); for(int b=0;b<N/256;b++) if(ref[b]!=bm[b]) ok=0;} printf("blockarg check %s\n",ok?"ok":"WRONG");
}
