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

var<workgroup> shared_memory_10: array<f32, 512>;

var<workgroup> shared_memory_11: array<f32, 1>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn quantize_rows_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_102: u32;
var l_mut_16: f32;
var l_mut_180: u32;
var l_mut_27: vec4<f32>;
var l_mut_93: u32;
var l_mut_98: u32;
let l_0 = local_idx % u32(8);
let l_1 = local_idx / u32(8);
let l_2 = workgroup_id.x * u32(64);
let l_3 = workgroup_id.z * info.scalars_u32[3];
let l_4 = workgroup_id.y * info.scalars_u32[4];
let l_5 = l_3 + l_4;
let l_6 = workgroup_id.z * info.scalars_u32[7];
let l_7 = workgroup_id.y / info.scalars_u32[6];
let l_8 = l_6 + l_7;
let l_9 = l_8 * u32(16);

for (var l_mut_12: u32 = u32(0); l_mut_12 < u32(4); l_mut_12++) {
let l_13 = l_mut_12 * u32(16);
let l_14 = l_13 + l_1;
let l_15 = l_2 + l_14;
l_mut_16 = f32(0.0);
let l_17 = l_14 < u32(64);
let l_18 = l_15 < info.scalars_u32[0];
let l_19 = l_17 && l_18;
if l_19 {
let l_20 = l_15 * info.scalars_u32[5];
let l_21 = l_5 + l_20;

for (var l_mut_22: u32 = l_0; l_mut_22 < u32(16); l_mut_22 += u32(8)) {
let l_23 = l_21 / u32(4);
let l_24 = l_23 + l_mut_22;
let l_25 = buffer_0_global[l_24];
let l_26 = vec4<f32>(l_25);
l_mut_27 = l_26;
let l_28 = l_mut_27[u32(0)];
let l_29 = abs(l_28);
let l_30 = max(l_mut_16, l_29);
l_mut_16 = l_30;
let l_31 = l_mut_27[u32(1)];
let l_32 = abs(l_31);
let l_33 = max(l_mut_16, l_32);
l_mut_16 = l_33;
let l_34 = l_mut_27[u32(2)];
let l_35 = abs(l_34);
let l_36 = max(l_mut_16, l_35);
l_mut_16 = l_36;
let l_37 = l_mut_27[u32(3)];
let l_38 = abs(l_37);
let l_39 = max(l_mut_16, l_38);
l_mut_16 = l_39;
}
}
let l_40 = l_14 * u32(8);
let l_41 = l_40 + l_0;
shared_memory_10[l_41] = l_mut_16;
}
workgroupBarrier();

for (var l_mut_42: u32 = local_idx; l_mut_42 < u32(1); l_mut_42 += u32(128)) {
l_mut_16 = f32(0.0);
let l_43 = l_mut_42 * u32(64);
let l_44 = l_mut_42 * u32(64);
let l_45 = l_44 + u32(64);

for (var l_mut_46: u32 = l_43; l_mut_46 < l_45; l_mut_46++) {
let l_47 = l_mut_46 * u32(8);
let l_48 = l_47 + u32(0);
let l_49 = shared_memory_10[l_48];
let l_50 = max(l_mut_16, l_49);
l_mut_16 = l_50;
let l_51 = l_mut_46 * u32(8);
let l_52 = l_51 + u32(1);
let l_53 = shared_memory_10[l_52];
let l_54 = max(l_mut_16, l_53);
l_mut_16 = l_54;
let l_55 = l_mut_46 * u32(8);
let l_56 = l_55 + u32(2);
let l_57 = shared_memory_10[l_56];
let l_58 = max(l_mut_16, l_57);
l_mut_16 = l_58;
let l_59 = l_mut_46 * u32(8);
let l_60 = l_59 + u32(3);
let l_61 = shared_memory_10[l_60];
let l_62 = max(l_mut_16, l_61);
l_mut_16 = l_62;
let l_63 = l_mut_46 * u32(8);
let l_64 = l_63 + u32(4);
let l_65 = shared_memory_10[l_64];
let l_66 = max(l_mut_16, l_65);
l_mut_16 = l_66;
let l_67 = l_mut_46 * u32(8);
let l_68 = l_67 + u32(5);
let l_69 = shared_memory_10[l_68];
let l_70 = max(l_mut_16, l_69);
l_mut_16 = l_70;
let l_71 = l_mut_46 * u32(8);
let l_72 = l_71 + u32(6);
let l_73 = shared_memory_10[l_72];
let l_74 = max(l_mut_16, l_73);
l_mut_16 = l_74;
let l_75 = l_mut_46 * u32(8);
let l_76 = l_75 + u32(7);
let l_77 = shared_memory_10[l_76];
let l_78 = max(l_mut_16, l_77);
l_mut_16 = l_78;
}
let l_79 = l_mut_16 > f32(0.0);
let l_80 = bitcast<u32>(l_mut_16);
let l_81 = l_80 & u32(2147483648);
let l_82 = l_80 >> u32(23);
let l_83 = l_82 & u32(255);
let l_84 = u32(1123942400) >> u32(23);
let l_85 = l_84 & u32(255);
let l_86 = l_80 & u32(8388607);
let l_87 = l_86 | u32(8388608);
let l_88 = u32(1123942400) & u32(8388607);
let l_89 = l_88 | u32(8388608);
let l_90 = l_87 < l_89;
let l_91 = select(u32(0), u32(1), l_90);
let l_92 = l_87 << l_91;
l_mut_93 = l_92;
let l_94 = l_83 + u32(127);
let l_95 = l_94 + u32(256);
let l_96 = l_95 - l_85;
let l_97 = l_96 - l_91;
l_mut_98 = u32(0);

for (var l_mut_99: u32 = u32(0); l_mut_99 < u32(25); l_mut_99++) {
l_mut_98 = l_mut_98 << u32(1);
let l_100 = l_mut_93 >= l_89;
if l_100 {
l_mut_93 = l_mut_93 - l_89;
l_mut_98 = l_mut_98 | u32(1);
}
l_mut_93 = l_mut_93 << u32(1);
}
let l_101 = l_mut_98 >> u32(1);
l_mut_102 = l_101;
let l_103 = l_mut_98 & u32(1);
let l_104 = l_103 == u32(1);
let l_105 = l_mut_93 != u32(0);
let l_106 = l_mut_102 & u32(1);
let l_107 = l_106 == u32(1);
let l_108 = l_105 || l_107;
let l_109 = l_104 && l_108;
let l_110 = select(u32(0), u32(1), l_109);
l_mut_102 = l_mut_102 + l_110;
let l_111 = l_mut_102 >> u32(24);
l_mut_102 = l_mut_102 >> l_111;
let l_112 = l_97 + l_111;
let l_113 = l_83 != u32(0);
let l_114 = l_112 >= u32(257);
let l_115 = l_113 && l_114;
let l_116 = l_112 <= u32(510);
let l_117 = l_115 && l_116;
let l_118 = l_112 - u32(256);
let l_119 = l_118 << u32(23);
let l_120 = l_81 | l_119;
let l_121 = l_mut_102 & u32(8388607);
let l_122 = l_120 | l_121;
let l_123 = select(l_81, l_122, l_117);
let l_124 = bitcast<f32>(l_123);
let l_125 = select(f32(1.0), l_124, l_79);
shared_memory_11[l_mut_42] = l_125;
let l_126 = workgroup_id.z * info.scalars_u32[1];
let l_127 = l_126 + workgroup_id.y;
let l_128 = l_127 * info.scalars_u32[2];
let l_129 = l_128 + workgroup_id.x;
let l_130 = l_129 * u32(1);
let l_131 = l_130 + l_mut_42;
let l_132 = l_125 * info.scalars_f32[0];
buffer_2_global[l_131] = l_132;
}
workgroupBarrier();

for (var l_mut_133: u32 = u32(0); l_mut_133 < u32(4); l_mut_133++) {
let l_134 = l_mut_133 * u32(16);
let l_135 = l_134 + l_1;
let l_136 = l_2 + l_135;
let l_137 = l_135 < u32(64);
let l_138 = l_136 < info.scalars_u32[0];
let l_139 = l_137 && l_138;
if l_139 {
l_mut_102 = u32(0);
let l_140 = shared_memory_11[l_mut_102];
let l_141 = f32(1.0) / l_140;
let l_142 = l_136 * info.scalars_u32[5];
let l_143 = l_5 + l_142;

for (var l_mut_144: u32 = l_0; l_mut_144 < u32(16); l_mut_144 += u32(8)) {
let l_145 = l_143 / u32(4);
let l_146 = l_145 + l_mut_144;
let l_147 = buffer_0_global[l_146];
let l_148 = vec4<f32>(l_147);
l_mut_27 = l_148;
l_mut_102 = u32(0);

for (var l_mut_149: u32 = u32(0); l_mut_149 < u32(4); l_mut_149++) {
let l_150 = l_mut_27[l_mut_149];
let l_151 = abs(l_150);
let l_152 = l_151 * l_141;
l_mut_16 = l_152;
let l_153 = floor(l_152);
let l_154 = l_152 - l_153;
let l_155 = l_154 - f32(0.5);
let l_156 = abs(l_155);
let l_157 = l_156 < f32(6.103515625e-5);
if l_157 {
let l_158 = abs(l_150);
let l_159 = bitcast<u32>(l_140);
let l_160 = bitcast<u32>(l_158);
let l_161 = l_160 & u32(2147483648);
let l_162 = l_160 >> u32(23);
let l_163 = l_162 & u32(255);
let l_164 = l_159 >> u32(23);
let l_165 = l_164 & u32(255);
let l_166 = l_160 & u32(8388607);
let l_167 = l_166 | u32(8388608);
let l_168 = l_159 & u32(8388607);
let l_169 = l_168 | u32(8388608);
let l_170 = l_167 < l_169;
let l_171 = select(u32(0), u32(1), l_170);
let l_172 = l_167 << l_171;
l_mut_98 = l_172;
let l_173 = l_163 + u32(127);
let l_174 = l_173 + u32(256);
let l_175 = l_174 - l_165;
let l_176 = l_175 - l_171;
l_mut_93 = u32(0);

for (var l_mut_177: u32 = u32(0); l_mut_177 < u32(25); l_mut_177++) {
l_mut_93 = l_mut_93 << u32(1);
let l_178 = l_mut_98 >= l_169;
if l_178 {
l_mut_98 = l_mut_98 - l_169;
l_mut_93 = l_mut_93 | u32(1);
}
l_mut_98 = l_mut_98 << u32(1);
}
let l_179 = l_mut_93 >> u32(1);
l_mut_180 = l_179;
let l_181 = l_mut_93 & u32(1);
let l_182 = l_181 == u32(1);
let l_183 = l_mut_98 != u32(0);
let l_184 = l_mut_180 & u32(1);
let l_185 = l_184 == u32(1);
let l_186 = l_183 || l_185;
let l_187 = l_182 && l_186;
let l_188 = select(u32(0), u32(1), l_187);
l_mut_180 = l_mut_180 + l_188;
let l_189 = l_mut_180 >> u32(24);
l_mut_180 = l_mut_180 >> l_189;
let l_190 = l_176 + l_189;
let l_191 = l_163 != u32(0);
let l_192 = l_190 >= u32(257);
let l_193 = l_191 && l_192;
let l_194 = l_190 <= u32(510);
let l_195 = l_193 && l_194;
let l_196 = l_190 - u32(256);
let l_197 = l_196 << u32(23);
let l_198 = l_161 | l_197;
let l_199 = l_mut_180 & u32(8388607);
let l_200 = l_198 | l_199;
let l_201 = select(l_161, l_200, l_195);
let l_202 = bitcast<f32>(l_201);
l_mut_16 = l_202;
}
let l_203 = round(l_mut_16);
let l_204 = min(l_203, f32(127.0));
let l_205 = l_150 < f32(0.0);
let l_206 = -l_204;
let l_207 = select(l_204, l_206, l_205);
let l_208 = l_207 < f32(0.0);
let l_209 = l_207 + f32(256.0);
let l_210 = select(l_207, l_209, l_208);
let l_211 = u32(l_210);
let l_212 = u32(8) * l_mut_149;
let l_213 = l_211 << l_212;
l_mut_102 = l_mut_102 | l_213;
}
let l_214 = l_143 / u32(4);
let l_215 = l_214 + l_mut_144;
buffer_1_global[l_215] = l_mut_102;
}
let l_216 = l_0 == u32(0);
if l_216 {
l_mut_16 = f32(0.0);

for (var l_mut_217: u32 = u32(0); l_mut_217 < u32(16); l_mut_217++) {
let l_218 = l_143 / u32(4);
let l_219 = l_218 + l_mut_217;
let l_220 = buffer_0_global[l_219];
let l_221 = vec4<f32>(l_220);
let l_222 = l_9 + l_mut_217;
let l_223 = buffer_3_global[l_222];
let l_224 = l_221[u32(0)];
let l_225 = l_223[u32(0)];
let l_226 = l_224 * l_225;
l_mut_16 = l_mut_16 + l_226;
let l_227 = l_221[u32(1)];
let l_228 = l_223[u32(1)];
let l_229 = l_227 * l_228;
l_mut_16 = l_mut_16 + l_229;
let l_230 = l_221[u32(2)];
let l_231 = l_223[u32(2)];
let l_232 = l_230 * l_231;
l_mut_16 = l_mut_16 + l_232;
let l_233 = l_221[u32(3)];
let l_234 = l_223[u32(3)];
let l_235 = l_233 * l_234;
l_mut_16 = l_mut_16 + l_235;
}
let l_236 = workgroup_id.z * info.scalars_u32[1];
let l_237 = l_236 + workgroup_id.y;
let l_238 = l_237 * info.scalars_u32[0];
let l_239 = l_238 + l_136;
let l_240 = l_mut_16 * info.scalars_f32[1];
buffer_4_global[l_239] = l_240;
}
}
}
}
