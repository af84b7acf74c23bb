// The single core's read ceiling (docs/performance-history.md, "Greedy in one pass"): 64 rows x 163840 f32 read one at a
// time, two interleaved, or with software prefetch. gcc -O2 -march=x86-64-v4 -o stream_rows bench/micro/stream_rows.c -lm
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <math.h>
#define N 163840
#define ROWS 64
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
#define NINF _mm512_set1_ps(-INFINITY)
__attribute__((noinline)) float one(const float*r){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;__mmask16 k=0;
 for(int i=0;i<N;i+=64){__m512 x0=_mm512_loadu_ps(r+i),x1=_mm512_loadu_ps(r+i+16),x2=_mm512_loadu_ps(r+i+32),x3=_mm512_loadu_ps(r+i+48);
 k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x2,x3,_CMP_UNORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)))+k;}
__attribute__((noinline)) float two(const float*r,const float*s){__m512 a0=NINF,a1=a0,b0=a0,b1=a0;__mmask16 k=0;
 for(int i=0;i<N;i+=32){__m512 x0=_mm512_loadu_ps(r+i),x1=_mm512_loadu_ps(r+i+16),y0=_mm512_loadu_ps(s+i),y1=_mm512_loadu_ps(s+i+16);
 k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(y0,y1,_CMP_UNORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);b0=_mm512_max_ps(y0,b0);b1=_mm512_max_ps(y1,b1);}
 return _mm512_reduce_max_ps(_mm512_max_ps(a0,a1))+_mm512_reduce_max_ps(_mm512_max_ps(b0,b1))+k;}
__attribute__((noinline)) float onepf(const float*r,int d){__m512 a0=NINF,a1=a0,a2=a0,a3=a0;__mmask16 k=0;
 for(int i=0;i<N;i+=64){_mm_prefetch((const char*)(r+i+d),_MM_HINT_T0);_mm_prefetch((const char*)(r+i+d+32),_MM_HINT_T0);__m512 x0=_mm512_loadu_ps(r+i),x1=_mm512_loadu_ps(r+i+16),x2=_mm512_loadu_ps(r+i+32),x3=_mm512_loadu_ps(r+i+48);
 k|=_mm512_cmp_ps_mask(x0,x1,_CMP_UNORD_Q)|_mm512_cmp_ps_mask(x2,x3,_CMP_UNORD_Q);
 a0=_mm512_max_ps(x0,a0);a1=_mm512_max_ps(x1,a1);a2=_mm512_max_ps(x2,a2);a3=_mm512_max_ps(x3,a3);}
 return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0,a1),_mm512_max_ps(a2,a3)))+k;}
int cmpd(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(){float*r=aligned_alloc(64,(size_t)N*ROWS*4);for(long i=0;i<(long)N*ROWS;i++)r[i]=(i*7919%1000)*0.001f;
 volatile float s; double t[5][41];
 for(int rep=0;rep<41;rep++){double a;
  a=now();for(int q=0;q<ROWS;q++)s=one(r+(long)q*N);t[0][rep]=(now()-a)/ROWS;
  a=now();for(int q=0;q<ROWS;q+=2)s=two(r+(long)q*N,r+(long)(q+1)*N);t[1][rep]=(now()-a)/ROWS;
  a=now();for(int q=0;q<ROWS;q++)s=onepf(r+(long)q*N,1024);t[2][rep]=(now()-a)/ROWS;
  a=now();for(int q=0;q<ROWS;q++)s=onepf(r+(long)q*N,4096);t[3][rep]=(now()-a)/ROWS;
  a=now();for(int q=0;q<ROWS;q+=2)s=two(r+(long)q*N,r+(long)(q+32 < ROWS? q+32: q+1)*N);t[4][rep]=(now()-a)/ROWS;}
 const char*nm[]={"one","two-rows","pf1024","pf4096","two-far"};
 for(int f=0;f<5;f++){qsort(t[f],41,8,cmpd);printf("%-10s %.2f us/row\n",nm[f],t[f][20]/1e3);}
}
