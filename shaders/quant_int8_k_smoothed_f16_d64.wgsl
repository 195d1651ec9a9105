enable f16;@group(0)
@binding(0)
var<storage, read_write> buffer_0_global: array<vec4<f16>>;

@group(0)
@binding(1)
var<storage, read_write> buffer_1_global: array<u32>;

@group(0)
@binding(2)
var<storage, read_write> buffer_2_global: array<f32>;

@group(0)
@binding(3)
var<storage, read_write> buffer_3_global: array<vec4<f32>>;

@group(0)
@binding(4)
var<storage, read_write> buffer_4_global: array<f32>;

struct info_st {
   scalars_f32: array<f32, 2>,
   scalars_u32: array<u32, 8>,
   static_meta: array<u32, 10>,
}

@group(0)
@binding(5)
var<storage, read> info: info_st;

var<workgroup> shared_memory_10: array<f32, 256>;

var<workgroup> shared_memory_12: array<f32, 32>;

var<workgroup> shared_memory_13: array<f32, 1>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn quantize_rows_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_101: u32;
var l_mut_106: u32;
var l_mut_110: u32;
var l_mut_18: f32;
var l_mut_190: u32;
var l_mut_19: f32;
var l_mut_30: vec4<f32>;
let l_0 = local_idx % u32(8);
let l_1 = local_idx / u32(8);
let l_2 = workgroup_id.x * u32(32);
let l_3 = workgroup_id.z * info.scalars_u32[3];
let l_4 = workgroup_id.y * info.scalars_u32[4];
let l_5 = l_3 + l_4;
let l_6 = workgroup_id.z * info.scalars_u32[7];
let l_7 = workgroup_id.y / info.scalars_u32[6];
let l_8 = l_6 + l_7;
let l_9 = l_8 * u32(16);

for (var l_mut_14: u32 = u32(0); l_mut_14 < u32(2); l_mut_14++) {
let l_15 = l_mut_14 * u32(16);
let l_16 = l_15 + l_1;
let l_17 = l_2 + l_16;
l_mut_18 = f32(0.0);
l_mut_19 = f32(0.0);
let l_20 = l_16 < u32(32);
let l_21 = l_17 < info.scalars_u32[0];
let l_22 = l_20 && l_21;
if l_22 {
let l_23 = l_17 * info.scalars_u32[5];
let l_24 = l_5 + l_23;

for (var l_mut_25: u32 = l_0; l_mut_25 < u32(16); l_mut_25 += u32(8)) {
let l_26 = l_24 / u32(4);
let l_27 = l_26 + l_mut_25;
let l_28 = buffer_0_global[l_27];
let l_29 = vec4<f32>(l_28);
l_mut_30 = l_29;
let l_31 = l_9 + l_mut_25;
let l_32 = buffer_3_global[l_31];
l_mut_30 = l_mut_30 - l_32;
let l_33 = l_mut_30[u32(0)];
let l_34 = abs(l_33);
let l_35 = max(l_mut_18, l_34);
l_mut_18 = l_35;
let l_36 = l_mut_30[u32(1)];
let l_37 = abs(l_36);
let l_38 = max(l_mut_18, l_37);
l_mut_18 = l_38;
let l_39 = l_mut_30[u32(2)];
let l_40 = abs(l_39);
let l_41 = max(l_mut_18, l_40);
l_mut_18 = l_41;
let l_42 = l_mut_30[u32(3)];
let l_43 = abs(l_42);
let l_44 = max(l_mut_18, l_43);
l_mut_18 = l_44;
}
}
let l_45 = l_16 * u32(8);
let l_46 = l_45 + l_0;
shared_memory_10[l_46] = l_mut_18;
}
workgroupBarrier();

for (var l_mut_47: u32 = local_idx; l_mut_47 < u32(32); l_mut_47 += u32(128)) {
l_mut_19 = f32(0.0);
let l_48 = l_mut_47 * u32(8);
let l_49 = l_48 + u32(0);
let l_50 = shared_memory_10[l_49];
let l_51 = max(l_mut_19, l_50);
l_mut_19 = l_51;
let l_52 = l_mut_47 * u32(8);
let l_53 = l_52 + u32(1);
let l_54 = shared_memory_10[l_53];
let l_55 = max(l_mut_19, l_54);
l_mut_19 = l_55;
let l_56 = l_mut_47 * u32(8);
let l_57 = l_56 + u32(2);
let l_58 = shared_memory_10[l_57];
let l_59 = max(l_mut_19, l_58);
l_mut_19 = l_59;
let l_60 = l_mut_47 * u32(8);
let l_61 = l_60 + u32(3);
let l_62 = shared_memory_10[l_61];
let l_63 = max(l_mut_19, l_62);
l_mut_19 = l_63;
let l_64 = l_mut_47 * u32(8);
let l_65 = l_64 + u32(4);
let l_66 = shared_memory_10[l_65];
let l_67 = max(l_mut_19, l_66);
l_mut_19 = l_67;
let l_68 = l_mut_47 * u32(8);
let l_69 = l_68 + u32(5);
let l_70 = shared_memory_10[l_69];
let l_71 = max(l_mut_19, l_70);
l_mut_19 = l_71;
let l_72 = l_mut_47 * u32(8);
let l_73 = l_72 + u32(6);
let l_74 = shared_memory_10[l_73];
let l_75 = max(l_mut_19, l_74);
l_mut_19 = l_75;
let l_76 = l_mut_47 * u32(8);
let l_77 = l_76 + u32(7);
let l_78 = shared_memory_10[l_77];
let l_79 = max(l_mut_19, l_78);
l_mut_19 = l_79;
shared_memory_12[l_mut_47] = l_mut_19;
}
workgroupBarrier();

for (var l_mut_80: u32 = local_idx; l_mut_80 < u32(1); l_mut_80 += u32(128)) {
l_mut_19 = f32(0.0);
let l_81 = l_mut_80 * u32(32);
let l_82 = l_mut_80 * u32(32);
let l_83 = l_82 + u32(32);

for (var l_mut_84: u32 = l_81; l_mut_84 < l_83; l_mut_84++) {
let l_85 = shared_memory_12[l_mut_84];
let l_86 = max(l_mut_19, l_85);
l_mut_19 = l_86;
}
let l_87 = l_mut_19 > f32(0.0);
let l_88 = bitcast<u32>(l_mut_19);
let l_89 = l_88 & u32(2147483648);
let l_90 = l_88 >> u32(23);
let l_91 = l_90 & u32(255);
let l_92 = u32(1123942400) >> u32(23);
let l_93 = l_92 & u32(255);
let l_94 = l_88 & u32(8388607);
let l_95 = l_94 | u32(8388608);
let l_96 = u32(1123942400) & u32(8388607);
let l_97 = l_96 | u32(8388608);
let l_98 = l_95 < l_97;
let l_99 = select(u32(0), u32(1), l_98);
let l_100 = l_95 << l_99;
l_mut_101 = l_100;
let l_102 = l_91 + u32(127);
let l_103 = l_102 + u32(256);
let l_104 = l_103 - l_93;
let l_105 = l_104 - l_99;
l_mut_106 = u32(0);

for (var l_mut_107: u32 = u32(0); l_mut_107 < u32(25); l_mut_107++) {
l_mut_106 = l_mut_106 << u32(1);
let l_108 = l_mut_101 >= l_97;
if l_108 {
l_mut_101 = l_mut_101 - l_97;
l_mut_106 = l_mut_106 | u32(1);
}
l_mut_101 = l_mut_101 << u32(1);
}
let l_109 = l_mut_106 >> u32(1);
l_mut_110 = l_109;
let l_111 = l_mut_106 & u32(1);
let l_112 = l_111 == u32(1);
let l_113 = l_mut_101 != u32(0);
let l_114 = l_mut_110 & u32(1);
let l_115 = l_114 == u32(1);
let l_116 = l_113 || l_115;
let l_117 = l_112 && l_116;
let l_118 = select(u32(0), u32(1), l_117);
l_mut_110 = l_mut_110 + l_118;
let l_119 = l_mut_110 >> u32(24);
l_mut_110 = l_mut_110 >> l_119;
let l_120 = l_105 + l_119;
let l_121 = l_91 != u32(0);
let l_122 = l_120 >= u32(257);
let l_123 = l_121 && l_122;
let l_124 = l_120 <= u32(510);
let l_125 = l_123 && l_124;
let l_126 = l_120 - u32(256);
let l_127 = l_126 << u32(23);
let l_128 = l_89 | l_127;
let l_129 = l_mut_110 & u32(8388607);
let l_130 = l_128 | l_129;
let l_131 = select(l_89, l_130, l_125);
let l_132 = bitcast<f32>(l_131);
let l_133 = select(f32(1.0), l_132, l_87);
shared_memory_13[l_mut_80] = l_133;
let l_134 = workgroup_id.z * info.scalars_u32[1];
let l_135 = l_134 + workgroup_id.y;
let l_136 = l_135 * info.scalars_u32[2];
let l_137 = l_136 + workgroup_id.x;
let l_138 = l_137 * u32(1);
let l_139 = l_138 + l_mut_80;
let l_140 = l_133 * info.scalars_f32[0];
buffer_2_global[l_139] = l_140;
}
workgroupBarrier();

for (var l_mut_141: u32 = u32(0); l_mut_141 < u32(2); l_mut_141++) {
let l_142 = l_mut_141 * u32(16);
let l_143 = l_142 + l_1;
let l_144 = l_2 + l_143;
let l_145 = l_143 < u32(32);
let l_146 = l_144 < info.scalars_u32[0];
let l_147 = l_145 && l_146;
if l_147 {
l_mut_110 = u32(0);
let l_148 = shared_memory_13[l_mut_110];
let l_149 = f32(1.0) / l_148;
let l_150 = l_144 * info.scalars_u32[5];
let l_151 = l_5 + l_150;

for (var l_mut_152: u32 = l_0; l_mut_152 < u32(16); l_mut_152 += u32(8)) {
let l_153 = l_151 / u32(4);
let l_154 = l_153 + l_mut_152;
let l_155 = buffer_0_global[l_154];
let l_156 = vec4<f32>(l_155);
l_mut_30 = l_156;
let l_157 = l_9 + l_mut_152;
let l_158 = buffer_3_global[l_157];
l_mut_30 = l_mut_30 - l_158;
l_mut_110 = u32(0);

for (var l_mut_159: u32 = u32(0); l_mut_159 < u32(4); l_mut_159++) {
let l_160 = l_mut_30[l_mut_159];
let l_161 = abs(l_160);
let l_162 = l_161 * l_149;
l_mut_19 = l_162;
let l_163 = floor(l_162);
let l_164 = l_162 - l_163;
let l_165 = l_164 - f32(0.5);
let l_166 = abs(l_165);
let l_167 = l_166 < f32(6.103515625e-5);
if l_167 {
let l_168 = abs(l_160);
let l_169 = bitcast<u32>(l_148);
let l_170 = bitcast<u32>(l_168);
let l_171 = l_170 & u32(2147483648);
let l_172 = l_170 >> u32(23);
let l_173 = l_172 & u32(255);
let l_174 = l_169 >> u32(23);
let l_175 = l_174 & u32(255);
let l_176 = l_170 & u32(8388607);
let l_177 = l_176 | u32(8388608);
let l_178 = l_169 & u32(8388607);
let l_179 = l_178 | u32(8388608);
let l_180 = l_177 < l_179;
let l_181 = select(u32(0), u32(1), l_180);
let l_182 = l_177 << l_181;
l_mut_106 = l_182;
let l_183 = l_173 + u32(127);
let l_184 = l_183 + u32(256);
let l_185 = l_184 - l_175;
let l_186 = l_185 - l_181;
l_mut_101 = u32(0);

for (var l_mut_187: u32 = u32(0); l_mut_187 < u32(25); l_mut_187++) {
l_mut_101 = l_mut_101 << u32(1);
let l_188 = l_mut_106 >= l_179;
if l_188 {
l_mut_106 = l_mut_106 - l_179;
l_mut_101 = l_mut_101 | u32(1);
}
l_mut_106 = l_mut_106 << u32(1);
}
let l_189 = l_mut_101 >> u32(1);
l_mut_190 = l_189;
let l_191 = l_mut_101 & u32(1);
let l_192 = l_191 == u32(1);
let l_193 = l_mut_106 != u32(0);
let l_194 = l_mut_190 & u32(1);
let l_195 = l_194 == u32(1);
let l_196 = l_193 || l_195;
let l_197 = l_192 && l_196;
let l_198 = select(u32(0), u32(1), l_197);
l_mut_190 = l_mut_190 + l_198;
let l_199 = l_mut_190 >> u32(24);
l_mut_190 = l_mut_190 >> l_199;
let l_200 = l_186 + l_199;
let l_201 = l_173 != u32(0);
let l_202 = l_200 >= u32(257);
let l_203 = l_201 && l_202;
let l_204 = l_200 <= u32(510);
let l_205 = l_203 && l_204;
let l_206 = l_200 - u32(256);
let l_207 = l_206 << u32(23);
let l_208 = l_171 | l_207;
let l_209 = l_mut_190 & u32(8388607);
let l_210 = l_208 | l_209;
let l_211 = select(l_171, l_210, l_205);
let l_212 = bitcast<f32>(l_211);
l_mut_19 = l_212;
}
let l_213 = round(l_mut_19);
let l_214 = min(l_213, f32(127.0));
let l_215 = l_160 < f32(0.0);
let l_216 = -l_214;
let l_217 = select(l_214, l_216, l_215);
let l_218 = l_217 < f32(0.0);
let l_219 = l_217 + f32(256.0);
let l_220 = select(l_217, l_219, l_218);
let l_221 = u32(l_220);
let l_222 = u32(8) * l_mut_159;
let l_223 = l_221 << l_222;
l_mut_110 = l_mut_110 | l_223;
}
let l_224 = l_151 / u32(4);
let l_225 = l_224 + l_mut_152;
buffer_1_global[l_225] = l_mut_110;
}
}
}
}
