// Host-emulation shim for CUDA's vector types: same members, sizes and
// alignments as the CUDA headers, so reinterpret_casts to float4/int4 etc.
// in generated code keep their meaning (16-byte vector loads stay 16 bytes).
#pragma once
#include <cstdint>

#define KF_EMU_VEC2(T, N, A) struct alignas(A) N##2 { T x, y; }; \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define KF_EMU_VEC4(T, N, A) struct alignas(A) N##4 { T x, y, z, w; }; \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
#define KF_EMU_VEC1(T, N) struct N##1 { T x; }; inline N##1 make_##N##1(T x) { return N##1{x}; }

KF_EMU_VEC1(char, char) KF_EMU_VEC2(char, char, 2) KF_EMU_VEC4(char, char, 4)
KF_EMU_VEC1(unsigned char, uchar) KF_EMU_VEC2(unsigned char, uchar, 2) KF_EMU_VEC4(unsigned char, uchar, 4)
KF_EMU_VEC1(short, short) KF_EMU_VEC2(short, short, 4) KF_EMU_VEC4(short, short, 8)
KF_EMU_VEC1(unsigned short, ushort) KF_EMU_VEC2(unsigned short, ushort, 4) KF_EMU_VEC4(unsigned short, ushort, 8)
KF_EMU_VEC1(int, int) KF_EMU_VEC2(int, int, 8) KF_EMU_VEC4(int, int, 16)
KF_EMU_VEC1(unsigned int, uint) KF_EMU_VEC2(unsigned int, uint, 8) KF_EMU_VEC4(unsigned int, uint, 16)
KF_EMU_VEC1(float, float) KF_EMU_VEC2(float, float, 8) KF_EMU_VEC4(float, float, 16)
KF_EMU_VEC1(long long, longlong) KF_EMU_VEC2(long long, longlong, 16) KF_EMU_VEC4(long long, longlong, 16)
KF_EMU_VEC1(unsigned long long, ulonglong) KF_EMU_VEC2(unsigned long long, ulonglong, 16)
KF_EMU_VEC1(double, double) KF_EMU_VEC2(double, double, 16)

#undef KF_EMU_VEC1
#undef KF_EMU_VEC2
#undef KF_EMU_VEC4

struct uint3 { unsigned int x, y, z; };
struct int3 { int x, y, z; };
struct float3 { float x, y, z; };
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
inline int3 make_int3(int x, int y, int z) { return int3{x, y, z}; }
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
